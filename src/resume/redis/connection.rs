//! An instance's connection to Redis for short commands: made at first use, made again after
//! an error, and at once when it is found cut at its first use after Redis restarted.

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, FromRedisValue, Pipeline, RedisResult, ScriptInvocation,
};

use super::timing::BLOCK;
use crate::sync::{AtomicU64, Ordering};
use crate::sync::{Mutex, lock};

/// What [`Connection::run`] sends.
#[derive(Clone, Copy)]
enum Command<'a, 'b> {
    Pipe(&'a Pipeline),
    Script(&'a ScriptInvocation<'b>),
}

/// The connection every pump, reader and claim of an instance shares (multiplexed: requests
/// from many tasks go out together), and the client that makes it and the readers' own.
pub(crate) struct Connection {
    client: Client,
    cached: Mutex<Option<MultiplexedConnection>>,
    /// How many shared connections were made so far: one more than the last a caller saw
    /// means the connection was made again since (after an error: a restart, a dropped link).
    made: AtomicU64,
}

impl Connection {
    /// Made at its first use.
    pub(crate) fn new(client: Client) -> Self {
        Connection {
            client,
            cached: Mutex::new(None),
            made: AtomicU64::new(0),
        }
    }

    /// The shared connection, and whether it was made before this call (it may have been cut
    /// since: a restarted Redis, a dropped link).
    async fn cached(&self) -> RedisResult<(MultiplexedConnection, bool)> {
        if let Some(connection) = lock(&self.cached).clone() {
            return Ok((connection, true));
        }
        let connection = self.client.get_multiplexed_async_connection().await?;
        *lock(&self.cached) = Some(connection.clone());
        self.made.fetch_add(1, Ordering::Relaxed);
        Ok((connection, false))
    }

    /// How many shared connections were made so far.
    pub(crate) fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Runs `pipe` on the shared connection (see [`again`](Connection::again)).
    pub(crate) async fn query<T: FromRedisValue>(&self, pipe: &Pipeline) -> RedisResult<T> {
        self.run(Command::Pipe(pipe)).await
    }

    /// Runs the script `invocation` on the shared connection (see
    /// [`again`](Connection::again)), by its digest, loading it first when Redis does not have
    /// it (a restarted Redis has none).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        self.run(Command::Script(invocation)).await
    }

    async fn run<T: FromRedisValue>(&self, command: Command<'_, '_>) -> RedisResult<T> {
        let mut first = true;
        loop {
            let (mut connection, made_before) = self.cached().await?;
            let result = match command {
                Command::Pipe(pipe) => pipe.query_async(&mut connection).await,
                Command::Script(invocation) => invocation.invoke_async(&mut connection).await,
            };
            if !self.again(&result, first && made_before) {
                return result;
            }
            first = false;
        }
    }

    /// After a command on the shared connection: whether to run it again. An error drops the
    /// connection, so the next use makes a new one. A connection made before this command
    /// (`made_before`) may have been cut while it sat idle (Redis restarted, the link dropped):
    /// found cut, it is made again at once and the command runs once more, so the first
    /// request after a restart does not fail for it.
    fn again<T>(&self, result: &RedisResult<T>, made_before: bool) -> bool {
        let Err(error) = result else {
            return false;
        };
        *lock(&self.cached) = None;
        made_before && error.is_unrecoverable_error()
    }

    /// A connection of its own for a reader, whose `XREAD BLOCK` waits for an answer.
    pub(crate) async fn dedicated(&self) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(BLOCK * 2));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
}
