//! Adoption: a running stream whose pump's lease lapsed (its instance died, or stalled past
//! the lease) taken over by this instance, with what its log holds, to be carried on here.

use bytes::Bytes;

use super::claim::Reservation;
use super::keys::{Entries, EntryId, Keys, LogEntry, millis, parse_entry, parse_id};
use super::shared::Shared;
use super::timing::{PUMP_LEASE, RUNNING_TTL};
use crate::resume::error::{AdoptError, StoreError};
use crate::sse::{ErrorShape, SseFrame};
use crate::sync::Arc;

/// Takes a running stream over for the claim `ARGV[1]` when its pump's lease (`pump`, Unix ms
/// on Redis's clock) has lapsed: the new lease lasts `ARGV[2]` ms, and every key (`KEYS`, the
/// meta key first) `ARGV[3]` ms more, so that the log read next is still there. Answers the
/// outcome, then (adopted) the request kept with the stream, the log's start and the stream's
/// error shape. Run again by the same claim, it answers the same.
const ADOPT: &str = r"
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'unknown'} end
if state == 'ended' then return {'ended'} end
if state ~= 'running' then return {'pumped'} end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
-- Run again by the same adoption (its answer was lost with its connection), it adopts again.
local again = redis.call('HGET', KEYS[1], 'claim') == ARGV[1]
if not again and tonumber(redis.call('HGET', KEYS[1], 'pump') or '0') > now then
    return {'pumped'}
end
local lease = string.format('%d', now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'claim', ARGV[1], 'pump', lease)
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
local kept = redis.call('HMGET', KEYS[1], 'request', 'start', 'shape')
return {'adopted', kept[1] or '', kept[2] or '0', kept[3] or ''}";

/// A stream this instance adopted: its hold, the request kept with it, where its log starts,
/// its error shape, and what its log holds (each frame with its entry id).
pub(crate) struct Adopted {
    pub(crate) reservation: Reservation,
    pub(crate) request: Bytes,
    pub(crate) start: u64,
    pub(crate) shape: ErrorShape,
    pub(crate) frames: Vec<(EntryId, SseFrame)>,
}

/// Adopts the stream `id` if its pump's lease lapsed: of two instances adopting it at once,
/// one wins, and from then on the old pump's appends are refused (see `pump::HOLD`).
pub(crate) async fn adopt(shared: &Arc<Shared>, id: &str) -> Result<Adopted, AdoptError> {
    let unavailable = |error| AdoptError::Unavailable(StoreError::new(error));
    let keys = Keys::new(id);
    let name = shared.name();
    let mut adopt = redis::pipe();
    adopt.cmd("EVAL").arg(ADOPT).arg(keys.all().len());
    for key in keys.all() {
        adopt.arg(key);
    }
    adopt
        .arg(&name)
        .arg(millis(PUMP_LEASE))
        .arg(millis(RUNNING_TTL));
    let (answer,): (Vec<Vec<u8>>,) = shared.redis.query(&adopt).await.map_err(unavailable)?;
    let text = |at: usize| answer.get(at).map(|bytes| Bytes::copy_from_slice(bytes));
    match text(0).as_deref() {
        Some(b"adopted") => {}
        Some(b"ended") => return Err(AdoptError::Finished),
        Some(b"pumped") => return Err(AdoptError::Pumped),
        _ => return Err(AdoptError::Unknown),
    }
    // The stream is this instance's from here: the hold renews its lease until its pump runs.
    let reservation = Reservation::adopted(shared, id, name);
    let start = text(2)
        .and_then(|start| std::str::from_utf8(&start).ok()?.parse().ok())
        .unwrap_or(0);
    let (entries,): (Entries,) = shared
        .redis
        .query(redis::pipe().cmd("XRANGE").arg(&keys.log).arg("-").arg("+"))
        .await
        .map_err(unavailable)?;
    let mut frames = Vec::with_capacity(entries.len());
    for (entry, fields) in entries {
        let parsed = parse_id(&entry).and_then(|id| Some((id, parse_entry(id, &fields)?)));
        match parsed {
            Some((id, LogEntry::Frame(frame))) => frames.push((id, frame)),
            // The end marker is written with the state `ended`: not in a running stream.
            Some((_, LogEntry::End)) => return Err(AdoptError::Finished),
            None => {
                let malformed = format!("the log of {id} holds an entry that is none of ours");
                let malformed = std::io::Error::new(std::io::ErrorKind::InvalidData, malformed);
                return Err(AdoptError::Unavailable(StoreError::new(malformed)));
            }
        }
    }
    let shape = text(3);
    let shape = shape
        .as_deref()
        .and_then(|name| std::str::from_utf8(name).ok());
    Ok(Adopted {
        reservation,
        request: text(1).unwrap_or_default(),
        start,
        shape: ErrorShape::from_name(shape),
        frames,
    })
}
