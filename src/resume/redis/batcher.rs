//! The instance's pumps' calls to Redis, grouped: every pump hands its append (the frames it
//! has ready) and its look (at its stream's readers and stop) to one task, which makes one
//! script call of everything the pumps handed it while the call before was on its way (a group
//! commit). The round trips, and Redis's wake-ups, per event fall as streams are added instead
//! of growing with them.
//!
//! A call takes keys of many streams, so it runs on one Redis (not a cluster, whose script
//! calls must keep to one slot).

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};

use redis::{ErrorKind, RedisError, RedisResult, ScriptInvocation, Value};
use tokio::sync::{mpsc, oneshot};

use super::connection::Connection;
use super::keys::{EntryId, Keys, format_id, millis};
use super::outage::away;
use super::timing::{PUMP_LEASE, RUNNING_TTL};
use crate::sse::{ErrorShape, SseFrame};
use crate::sync::Arc;

/// One pump's append: its frames, each with its entry id, for its claim, and what the log
/// gives up with them.
#[derive(Clone)]
pub(crate) struct Append {
    pub(crate) keys: Arc<Keys>,
    /// The claim's name: the frames go in only while the stream is still its own.
    pub(crate) name: String,
    /// The entry the log is trimmed to and its new `start`, when entries were evicted.
    pub(crate) evicted: Option<(EntryId, u64)>,
    /// Nothing appended yet: the log is new, and gets its TTL (the pump's looks renew it).
    pub(crate) fresh: bool,
    /// The stream's error shape, for a Redis back from a restart that lost it.
    pub(crate) shape: ErrorShape,
    /// If Redis lost the stream, the event its log starts again at (`None`: it is not made
    /// again, the answer says it is lost).
    pub(crate) again_from: Option<u64>,
    pub(crate) frames: Vec<(EntryId, SseFrame)>,
}

/// One pump's look at its stream, for its claim.
pub(crate) struct Look {
    pub(crate) keys: Arc<Keys>,
    pub(crate) name: String,
    /// Unix ms: the readers' leases that lapsed by then are dropped.
    pub(crate) now_ms: u64,
    /// The pump's lease and the keys' TTL to renew, in ms, if it is time to.
    pub(crate) renew: Option<(u64, u64)>,
}

/// What a look saw.
pub(crate) struct Looked {
    /// The readers with a live lease, on any instance.
    pub(crate) leased: Vec<String>,
    /// The positions readers on other instances wrote.
    pub(crate) positions: HashMap<String, u64>,
    /// A stop was asked for.
    pub(crate) stop: bool,
    /// Whose the stream is.
    pub(crate) standing: Standing,
}

/// Whose a stream is in Redis, as a call found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The calling pump's claim's: the call went through.
    Ours,
    /// Another claim's: another instance adopted it.
    Adopted,
    /// Not in Redis at all: it came back empty (a restart without persistence).
    Lost,
}

impl Append {
    /// An append of nothing that makes the stream of `keys` again in a Redis that lost it, for
    /// the claim `name`, its log starting at event `start`.
    pub(crate) fn again(keys: &Arc<Keys>, name: &str, shape: ErrorShape, start: u64) -> Self {
        Append {
            keys: keys.clone(),
            name: name.to_owned(),
            evicted: None,
            fresh: true,
            shape,
            again_from: Some(start),
            frames: Vec::new(),
        }
    }

    /// The same append, making the stream again (its log starting at event `start`) if Redis
    /// lost it.
    pub(crate) fn made_again_from(&self, start: u64) -> Self {
        Append {
            again_from: Some(start),
            fresh: true,
            ..self.clone()
        }
    }
}

impl Standing {
    /// A script's answer: 1 the claim's, 0 another's, 2 not in Redis (else a refusal).
    pub(crate) fn from_answer(answer: i64) -> RedisResult<Self> {
        match answer {
            1 => Ok(Standing::Ours),
            0 => Ok(Standing::Adopted),
            2 => Ok(Standing::Lost),
            _ => Err(RedisError::from((
                ErrorKind::Client,
                "Redis refused an append to the stream's log",
            ))),
        }
    }
}

enum Call {
    Append(Arc<Append>),
    Look(Look),
}

type Answer = oneshot::Sender<RedisResult<Value>>;

/// The pumps' calls, for a whole instance.
pub(crate) struct Batcher {
    redis: Arc<Connection>,
    /// To the task, started at the first call (inside the runtime).
    task: OnceLock<mpsc::UnboundedSender<(Call, Answer)>>,
}

/// The most calls one script call takes.
const MAX_GROUP: usize = 256;

/// The pumps' calls, in turn; one answer each.
///
/// An append (`ARGV` `a`; `KEYS` the stream's meta key and log) takes nine arguments more:
/// the claim's name, the entry to trim the log to and the new `start` (both empty: nothing
/// evicted), the keys' TTL in ms, whether the log is new (`1`, or empty: a new one gets the
/// TTL, which the pump's looks renew), the stream's error shape, the pump's lease in ms, the
/// event a stream Redis lost starts again at (empty: it is not made again), the number of
/// frames; then four per frame: its entry id, its `k`, its `f`, its `e` (or empty). Its frames
/// go in only while `claim` is still its own, so the old pump of an adopted stream writes
/// nothing. A frame the log refuses is fine only if the log has that very entry (it went in
/// with a call whose answer was lost). It answers 1 appended, 0 another claim's, 2 not in
/// Redis (and not made again), -1 Redis refused a frame.
///
/// A look (`ARGV` `l`; `KEYS` every key of the stream, as [`Keys::all`]) takes four: the time
/// (Unix ms) by which the readers' leases lapsed, the claim's name, the pump's lease and the
/// keys' TTL in ms (both empty: no renewal; the lease is on Redis's clock, as `pump::HOLD`
/// sets it). It counts itself (an attach on another instance knows so that it has been seen,
/// see `reader::seen`) and answers the readers with a lease, the positions readers on other
/// instances wrote (field, value, in turn), whether a stop was asked for, and whose the stream
/// is (1 the claim's, 0 another's, 2 not in Redis: then it writes nothing).
static CALLS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local answers = {}
local k, a = 1, 1
while a <= #ARGV do
    if ARGV[a] == 'a' then
        local meta, log = KEYS[k], KEYS[k + 1]
        local ttl, n = ARGV[a + 4], tonumber(ARGV[a + 9])
        local first, last = a + 10, a + 9 + 4 * n
        local answer = 0
        local claim = redis.call('HGET', meta, 'claim')
        local fresh = ARGV[a + 5] ~= ''
        if claim == false then
            if ARGV[a + 8] == '' then
                answer = 2
            else
                -- Redis came back empty: the stream again, its log from here on.
                local now = redis.call('TIME')
                local lease = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[a + 7])
                redis.call('HSET', meta, 'state', 'running', 'claim', ARGV[a + 1],
                    'start', ARGV[a + 8], 'pump', string.format('%d', lease),
                    'shape', ARGV[a + 6])
                redis.call('PEXPIRE', meta, ttl)
                claim, fresh = ARGV[a + 1], true
            end
        end
        if claim == ARGV[a + 1] then
            answer = 1
            for i = first, last, 4 do
                local added
                if ARGV[i + 3] == '' then
                    added = redis.pcall('XADD', log, ARGV[i], 'k', ARGV[i + 1], 'f', ARGV[i + 2])
                else
                    added = redis.pcall('XADD', log, ARGV[i], 'k', ARGV[i + 1], 'f', ARGV[i + 2],
                        'e', ARGV[i + 3])
                end
                -- Refused: fine only if the log has this very entry (it went in with a call
                -- whose answer was lost).
                if type(added) == 'table' and added.err then
                    local had = redis.call('XRANGE', log, ARGV[i], ARGV[i])
                    if #had == 0 then
                        answer = -1
                        break
                    end
                end
            end
            if answer == 1 and ARGV[a + 2] ~= '' then
                redis.call('XTRIM', log, 'MINID', ARGV[a + 2])
                -- The start only moves on.
                local start = tonumber(redis.call('HGET', meta, 'start') or '0')
                if tonumber(ARGV[a + 3]) > start then
                    redis.call('HSET', meta, 'start', ARGV[a + 3])
                end
            end
            if answer == 1 and fresh then redis.call('PEXPIRE', log, ttl) end
        end
        answers[#answers + 1] = answer
        k, a = k + 2, last + 1
    elseif redis.call('EXISTS', KEYS[k]) == 0 then
        -- Not in Redis at all (it came back empty): nothing is written.
        answers[#answers + 1] = {{}, {}, 0, 2}
        k, a = k + 5, a + 5
    else
        local meta, readers, positions = KEYS[k], KEYS[k + 2], KEYS[k + 3]
        redis.call('ZREMRANGEBYSCORE', readers, '-inf', ARGV[a + 1])
        local leased = redis.call('ZRANGE', readers, 0, -1)
        local written = redis.call('HGETALL', positions)
        local stop = redis.call('HEXISTS', meta, 'stop')
        redis.call('HINCRBY', meta, 'looks', 1)
        local held = 0
        if redis.call('HGET', meta, 'claim') == ARGV[a + 2] then held = 1 end
        if ARGV[a + 3] ~= '' then
            if held == 1 then
                local now = redis.call('TIME')
                local expiry = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[a + 3])
                redis.call('HSET', meta, 'pump', string.format('%d', expiry))
            end
            for i = k, k + 4 do redis.call('PEXPIRE', KEYS[i], ARGV[a + 4]) end
        end
        answers[#answers + 1] = {leased, written, stop, held}
        k, a = k + 5, a + 5
    end
end
return answers",
    )
});

impl Batcher {
    pub(crate) fn new(redis: Arc<Connection>) -> Self {
        Batcher {
            redis,
            task: OnceLock::new(),
        }
    }

    /// Appends, with whatever the other pumps have ready; whose the stream was.
    pub(crate) async fn append(&self, append: Arc<Append>) -> RedisResult<Standing> {
        let answer = self.call(Call::Append(append)).await?;
        Standing::from_answer(redis::from_redis_value(answer)?)
    }

    /// Looks at the stream, with whatever the other pumps have ready.
    pub(crate) async fn look(&self, look: Look) -> RedisResult<Looked> {
        let answer = self.call(Call::Look(look)).await?;
        let (leased, positions, stop, standing) = redis::from_redis_value(answer)?;
        Ok(Looked {
            leased,
            positions,
            stop,
            standing: Standing::from_answer(standing)?,
        })
    }

    /// Hands `call` to the task and waits for its answer.
    async fn call(&self, call: Call) -> RedisResult<Value> {
        let task = self.task.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.redis.clone(), rx));
            tx
        });
        let (answer, answered) = oneshot::channel();
        let gone = || RedisError::from((ErrorKind::Client, "the resume store's batcher stopped"));
        task.send((call, answer)).map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// The task: takes every call waiting (at most [`MAX_GROUP`]), makes one script call of them,
/// answers each; until the batcher is dropped. A call refused as a whole (a script error, not
/// Redis being away) is made again one by one, so one stream's failure is its own.
async fn run(redis: Arc<Connection>, mut calls: mpsc::UnboundedReceiver<(Call, Answer)>) {
    let mut group = Vec::new();
    while calls.recv_many(&mut group, MAX_GROUP).await > 0 {
        let answers = make(&redis, group.iter().map(|(call, _)| call)).await;
        let answers = match answers {
            Err(error) if group.len() > 1 && !away(&error) => {
                let mut each = Vec::with_capacity(group.len());
                for (call, _) in &group {
                    let answer = make(&redis, [call]).await;
                    each.push(answer.and_then(|mut one| {
                        one.pop()
                            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "no answer")))
                    }));
                }
                each
            }
            Err(error) => vec![Err(error); group.len()],
            Ok(answers) if answers.len() == group.len() => answers.into_iter().map(Ok).collect(),
            Ok(_) => {
                let error = RedisError::from((ErrorKind::Parse, "not an answer per call"));
                vec![Err(error); group.len()]
            }
        };
        for ((_, answer), result) in group.drain(..).zip(answers) {
            // A pump that went away meanwhile needs no answer.
            let _ = answer.send(result);
        }
    }
}

/// One script call of `calls`: an answer per call.
async fn make<'a>(
    redis: &Connection,
    calls: impl IntoIterator<Item = &'a Call>,
) -> RedisResult<Vec<Value>> {
    let mut script = CALLS.prepare_invoke();
    for call in calls {
        match call {
            Call::Append(append) => add_append(&mut script, append),
            Call::Look(look) => add_look(&mut script, look),
        }
    }
    redis.invoke(&script).await
}

/// Adds `append` to the call (see [`CALLS`]).
fn add_append(script: &mut ScriptInvocation<'_>, append: &Append) {
    script
        .key(&append.keys.meta)
        .key(&append.keys.log)
        .arg("a")
        .arg(&append.name);
    match append.evicted {
        Some((oldest, start)) => script.arg(format_id(oldest)).arg(start),
        None => script.arg("").arg(""),
    };
    script
        .arg(millis(RUNNING_TTL))
        .arg(if append.fresh { "1" } else { "" })
        .arg(append.shape.as_str())
        .arg(millis(PUMP_LEASE));
    match append.again_from {
        Some(start) => script.arg(start),
        None => script.arg(""),
    };
    script.arg(append.frames.len());
    for (id, frame) in &append.frames {
        // A terminal frame keeps its end reason, for the probes of a reader on any instance.
        let reason = frame.end_reason().map_or("", |reason| reason.as_str());
        script
            .arg(format_id(*id))
            .arg(frame.kind().as_str())
            .arg(&frame.bytes()[..])
            .arg(reason);
    }
}

/// Adds `look` to the call (see [`CALLS`]).
fn add_look(script: &mut ScriptInvocation<'_>, look: &Look) {
    for key in look.keys.all() {
        script.key(key);
    }
    script.arg("l").arg(look.now_ms).arg(&look.name);
    match look.renew {
        Some((lease, ttl)) => script.arg(lease).arg(ttl),
        None => script.arg("").arg(""),
    };
}
