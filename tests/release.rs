//! The release hook runs exactly once on every end path, and cancellation reaches the generator.

use std::future::pending;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use streamgate::{Consumer, EndReason, Gate, GateHandle, Policy};

/// Records every call of a release hook.
#[derive(Clone, Default)]
struct Hook(Arc<Mutex<Vec<EndReason>>>);

impl Hook {
    fn gate(&self) -> Gate {
        let calls = self.0.clone();
        Gate::new()
            .max_events(4)
            .on_release(move |reason, _| calls.lock().unwrap().push(reason))
    }

    fn calls(&self) -> Vec<EndReason> {
        self.0.lock().unwrap().clone()
    }
}

/// A generator that sends `n` tokens (or for ever), then returns.
fn tokens(gate: Gate, n: usize) -> Consumer<String> {
    gate.spawn(move |_, mut tx| async move {
        for i in 0..n {
            tx.send(format!("t{i} ")).await?;
        }
        Ok::<_, streamgate::SendError<String>>(())
    })
}

/// The end a consumer sees, after reading everything before it.
async fn end_seen(consumer: &mut Consumer<String>) -> Option<streamgate::GateError> {
    while let Some(item) = consumer.next().await {
        if let Err(error) = item {
            assert!(consumer.next().await.is_none(), "nothing follows the end");
            return Some(error);
        }
    }
    None
}

async fn released_once(hook: &Hook, handle: &GateHandle, reason: EndReason) {
    handle.released().await;
    assert_eq!(hook.calls(), vec![reason]);
    assert_eq!(handle.end_reason(), Some(reason));
    assert!(handle.stats().released);
}

async fn each_end_path() {
    // Completed.
    let hook = Hook::default();
    let mut consumer = tokens(hook.gate(), 10);
    let handle = consumer.handle();
    assert!(end_seen(&mut consumer).await.is_none());
    released_once(&hook, &handle, EndReason::Completed).await;

    // Generator error: delivered chunks first, then the error with its source.
    let hook = Hook::default();
    let mut consumer = hook.gate().spawn(|_, mut tx| async move {
        tx.send("partial".to_owned()).await.ok();
        Err(std::io::Error::other("decode failed"))
    });
    let handle = consumer.handle();
    assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "partial");
    let error = end_seen(&mut consumer).await.expect("an error end");
    assert_eq!(error.reason(), EndReason::GeneratorError);
    let source = std::error::Error::source(&error).expect("the generator's error");
    assert_eq!(source.to_string(), "decode failed");
    released_once(&hook, &handle, EndReason::GeneratorError).await;

    // Generator panic: caught, never unwinds into the consumer.
    let hook = Hook::default();
    let mut consumer = hook.gate().spawn(|_, mut tx| async move {
        tx.send("partial".to_owned()).await.ok();
        if tx.is_closed() {
            return Ok(());
        }
        panic!("kv cache corrupted");
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    });
    let handle = consumer.handle();
    assert_eq!(consumer.next().await.unwrap().unwrap().chunk(), "partial");
    let error = end_seen(&mut consumer).await.expect("an error end");
    assert_eq!(error.reason(), EndReason::GeneratorPanic);
    let source = std::error::Error::source(&error).unwrap();
    assert_eq!(source.to_string(), "kv cache corrupted");
    released_once(&hook, &handle, EndReason::GeneratorPanic).await;

    // Consumer dropped mid-stream, generator waiting on a full buffer.
    let hook = Hook::default();
    let mut consumer = tokens(hook.gate(), usize::MAX);
    let handle = consumer.handle();
    consumer.next().await.unwrap().unwrap();
    drop(consumer);
    released_once(&hook, &handle, EndReason::ConsumerGone).await;

    // Consumer dropped while the generator awaits something else entirely.
    let hook = Hook::default();
    let consumer = hook.gate().spawn(|_, mut tx| async move {
        tx.send("t0 ".to_owned()).await.ok();
        pending::<()>().await;
        Ok::<(), std::io::Error>(())
    });
    let handle = consumer.handle();
    drop(consumer);
    released_once(&hook, &handle, EndReason::ConsumerGone).await;

    // Cancelled through the handle: waiting events, then the reason.
    let hook = Hook::default();
    let mut consumer = tokens(hook.gate(), usize::MAX);
    let handle = consumer.handle();
    consumer.next().await.unwrap().unwrap();
    handle.cancel();
    let error = end_seen(&mut consumer).await.expect("an error end");
    assert_eq!(error.reason(), EndReason::Cancelled);
    released_once(&hook, &handle, EndReason::Cancelled).await;

    // Slow consumer.
    let hook = Hook::default();
    let consumer = tokens(
        hook.gate()
            .policy(Policy::disconnect(Duration::from_millis(50))),
        usize::MAX,
    );
    let handle = consumer.handle();
    let start = std::time::Instant::now();
    released_once(&hook, &handle, EndReason::SlowConsumer).await;
    // The 50 ms deadline runs from the first full buffer, within milliseconds of the start; 2 s
    // of slack covers any scheduling delay on a loaded machine, while a deadline that was
    // missed would show as the test's hang.
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_millis(50) + Duration::from_secs(2),
        "the slow-consumer end came after {waited:?}"
    );
    drop(consumer);
    assert_eq!(hook.calls().len(), 1);
}

#[tokio::test]
async fn release_runs_once_on_each_end_path() {
    each_end_path().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_runs_once_on_each_end_path_on_two_threads() {
    for _ in 0..20 {
        each_end_path().await;
    }
}

#[test]
fn release_runs_once_when_the_runtime_shuts_down() {
    let hook = Hook::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let (consumer, handle) = runtime.block_on(async {
        let consumer = hook.gate().spawn(|_, mut tx| async move {
            tx.send("t0 ".to_owned()).await.ok();
            pending::<()>().await;
            Ok::<(), std::io::Error>(())
        });
        let handle = consumer.handle();
        tokio::task::yield_now().await;
        (consumer, handle)
    });
    drop(runtime);
    assert_eq!(hook.calls(), vec![EndReason::Shutdown]);
    assert!(handle.is_released());
    drop(consumer);
    assert_eq!(hook.calls(), vec![EndReason::Shutdown]);
}

/// Many streams decoding on a timer, each dropped by its consumer at a different point: every
/// generator stops with at most one chunk produced after the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_token_after_cancel() {
    let released = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::new();
    for s in 0..100usize {
        let released = released.clone();
        let consumer = Gate::new()
            .max_events(4)
            .on_release(move |_, _| {
                released.fetch_add(1, Ordering::SeqCst);
            })
            .spawn(|_, mut tx| async move {
                for i in 0.. {
                    // A decode step, then publish; a careless generator ignores send errors.
                    if i % 3 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let _ = tx.send(format!("t{i} ")).await;
                }
                Ok::<(), std::io::Error>(())
            });
        streams.push(tokio::spawn(async move {
            let mut consumer = consumer;
            let handle = consumer.handle();
            for _ in 0..(s % 17) {
                consumer.next().await.unwrap().unwrap();
            }
            drop(consumer);
            handle.released().await;
            handle.stats()
        }));
    }
    for stream in streams {
        let stats = stream.await.unwrap();
        assert_eq!(stats.end_reason, Some(EndReason::ConsumerGone));
        assert!(stats.chunks_after_end <= 1, "{stats:?}");
        assert!(stats.end_to_release.is_some());
    }
    assert_eq!(released.load(Ordering::SeqCst), 100);
}
