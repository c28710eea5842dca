//! `resume::RedisRegistry` on a real `redis-server` (started here on a free port; the test says
//! SKIPPED and passes when it is not installed): a reader on another instance probes the same
//! end reason as the stream's own instance. (The reference server's instances sharing one Redis
//! are `cli/tests/sim_redis.rs`.)
#![cfg(feature = "redis")]

mod common;

use common::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_another_instance_probes_the_same_end_reason() {
    use futures_util::StreamExt;
    use streamgate::probe::HopProbe;
    use streamgate::resume::{RedisRegistry, ResumeOptions};
    use streamgate::sse::SseEvent;
    use streamgate::{EndReason, Gate, GateExt};

    let Some(redis) = RedisServer::start("end-reason") else {
        return;
    };
    let (here, there) = (
        RedisRegistry::new(&redis.url(), ResumeOptions::default()).unwrap(),
        RedisRegistry::new(&redis.url(), ResumeOptions::default()).unwrap(),
    );
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        tx.send(SseEvent::data("a")).await.ok();
        Err(std::io::Error::other("the decode loop failed"))
    });
    let first = here.register("failing", consumer).await.unwrap();
    let hop = HopProbe::new("client.recv");
    // The reader on the other instance sees the event, the terminal frame, and the end.
    let reader = there.attach("failing", None).await.unwrap();
    let frames: Vec<_> = tokio::time::timeout(common::HANG, reader.probe(&hop, "r").collect())
        .await
        .expect("the stream ends");
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[1].end_reason(), Some(EndReason::GeneratorError));
    assert_eq!(
        hop.snapshot().streams_ended.occurred(),
        [(EndReason::GeneratorError, 1)]
    );
    drop(first);
}
