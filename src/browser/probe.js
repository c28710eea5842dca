// streamgate browser probe: the user's screen as a measured hop.
//
// Served by streamgate's servers at `GET /streamgate/probe.js`. A dependency-free ES module:
// no build step, nothing global, and it never throws into the page.
//
// For every SSE event of a probed stream (one whose response carries `x-request-id` and
// `x-streamgate-probe: <token>`) that carries its own `id:` field, it records, with no payload
// text, only the event's id, size, kind and time:
//
//   client.recv    the event was parsed from the network (probedFetch reads the body ahead of
//                  the app, up to READ_AHEAD_EVENTS / READ_AHEAD_BYTES, so an app that is slow
//                  to ask for the next event shows at client.render, not here);
//   client.render  the app pulled the next chunk from the body after this event's chunk, and
//                  then the next frame was painted (the first task after a
//                  requestAnimationFrame), with `busy_ns`: how long long animation frames (or
//                  long tasks) overlapped the time since the previous render record. For a
//                  reader that reads lazily, as the OpenAI SDK's stream iterator does (it asks
//                  for the next chunk only when the loop body for the previous event has
//                  returned), that is "handled and painted". A consumer that reads ahead of its
//                  handler (a `pipeThrough` chain, a TransformStream, anything that buffers)
//                  pulls as soon as it can, so there render means "read", not "handled". For
//                  probeEventSource it is: the listeners returned, then a frame was painted;
//
// and one `end` record per hop when the stream ends. The kind is the server's: an event whose
// block holds a `:hidden` or `:control` comment line (exactly that line) before its blank line
// is `hidden` or `control`; an unmarked one is `visible`, but data `[DONE]` and `event: error`
// are `control`, and an `event: error` ends the stream's records as `upstream_error`. An
// EventSource page cannot see comments: all its events are `visible` (bar `[DONE]`).
//
// Records are batched per request and POSTed as `text/plain` JSON to `/streamgate/hop-records`
// on the origin of the stream (the response's URL: the server that gave the token), about once
// a second, or sooner when a full body's worth (at least FLUSH_RECORDS) is ready; each body at
// most POST_RECORDS records and POST_BYTES bytes. They go by fetch (keepalive while the probe's
// keepalive bodies in flight stay under KEEPALIVE_BYTES, as browsers cap them at 64 KiB in
// all); a POST that fails is never sent again (a rejected fetch, e.g. by CORS, may still have
// reached the server), its records count as dropped. Hiding the page (switching tabs) only
// flushes; leaving it (`pagehide`) ends the streams still recording as consumer_gone and sends
// what is pending with sendBeacon (a keepalive fetch where a beacon is refused).
// A response without the token header is not recorded: the server did not sample it.
//
// Usage:
//
//   import { probedFetch, probeEventSource, probeStats, probeFlush } from '/streamgate/probe.js';
//
//   // A drop-in fetch, e.g. for the OpenAI SDK:
//   const client = new OpenAI({ baseURL, apiKey, dangerouslyAllowBrowser: true, fetch: probedFetch });
//   const stream = await client.chat.completions.create({ model, messages, stream: true });
//   for await (const chunk of stream) show(chunk.choices[0]?.delta?.content ?? '');
//
//   // Or attach by URL (say a resume URL), with the id and token of the first response:
//   const source = probeEventSource(resumeUrl, { request: id, token });
//   source.onmessage = (event) => show(event.data);
//
//   console.log(probeStats());   // counts, for debugging
//   await probeFlush();          // send what is pending now (e.g. before a test reads the sink)
//
// Record format (one JSON object each, in `{"request","token","records":[...]}` bodies of at
// most 256 records and 16 KiB):
//   {"hop":"client.recv"|"client.render","seq":<event id>,"t_ns":<performance.now() in ns>,
//    "bytes":<UTF-8 length of data>,"kind":"visible"|"hidden"|"control"}  (+ "busy_ns" on render)
//   {..., "kind":"end","reason":"completed"|"consumer_gone"|"upstream_error","idle_ns":<ns>}
// `seq` is the event's SSE id (the last event id, which its own `id:` field set); an event
// without an `id:` field of its own, or whose id is not a decimal integer, is not recorded.
// An end's `seq` is one past the hop's last recorded event; `idle_ns` is the time since its
// last visible or hidden record (or the stream's start).

const SINK = '/streamgate/hop-records';
const TOKEN_HEADER = 'x-streamgate-probe';
const ID_HEADER = 'x-request-id';
const RECV = 'client.recv';
const RENDER = 'client.render';

const FLUSH_MS = 1000; // flush what is ready this often...
const FLUSH_RECORDS = 128; // ...or sooner, once at least this many (and a full body) are ready
const POST_RECORDS = 256; // at most this many records...
const POST_BYTES = 16 * 1024; // ...and bytes per POST (and beacon)
const KEEPALIVE_BYTES = 32 * 1024; // keepalive POST bodies in flight, at most (browsers: 64 KiB)
const MAX_PENDING = 10000; // past this, new records are dropped (and counted)
const YOUNG_RENDER_NS = 250e6; // a render record this young waits for its long-frame entries
const END_FLUSH_MS = 100; // after a stream's end, so the last frame's entries are in
const BACKOFF_MS = [2000, 60000]; // after a 429 or a failed POST, that sink waits: first, most
const BUSY_KEEP_NS = 300e9; // long-frame entries older than this are forgotten
const BUSY_MAX = 2000; // and at most this many are kept
// probedFetch reads the network ahead of the app while fewer than this many events (blocks),
// and fewer than this many bytes (of those blocks and of the unfinished one), are parsed but
// not yet taken by the app; past either (by at most one network read) it stops reading until
// the app takes one, so a slow app still holds the body back and the server feels it, as
// without the probe. An unfinished block that alone reaches READ_AHEAD_BYTES (no blank line
// in 1 MiB) stops the recording of its stream: its bytes pass through untouched.
const READ_AHEAD_EVENTS = 1000;
const READ_AHEAD_BYTES = 1024 * 1024;

const nativeFetch = typeof fetch === 'function' ? fetch : null;
const hasWindow = typeof window !== 'undefined' && typeof document !== 'undefined';
const utf8 = new TextEncoder();
const raf = hasWindow && typeof requestAnimationFrame === 'function' ? requestAnimationFrame : null;

const stats = {
  streams: 0, // probed streams seen (token header present)
  unprobed: 0, // event-stream responses without a token header (not sampled: normal)
  eventsRecorded: 0, // events given a client.recv record
  eventsWithoutId: 0, // events without an own numeric id, or repeating the last (not recorded)
  recordsSent: 0, // records in POSTs answered 2xx (or beacons queued)
  recordsRefused: 0, // records in POSTs answered 400/403/404/413, or for a refused request
  recordsDropped: 0, // records lost: memory bound, 429, failed fetch, beacon refused
  posts: 0, // POSTs and beacons made
  oversized: 0, // streams no longer recorded: an unfinished event passed READ_AHEAD_BYTES
  errors: 0, // internal errors caught (the probe then stops recording that stream)
};

/** A copy of the probe's counters, plus what is pending now. */
export function probeStats() {
  return { ...stats, pending: pendingTotal, activeStreams: active.size };
}

const now = () => Math.round(performance.now() * 1e6);

function guard(fn) {
  try {
    return fn();
  } catch (_) {
    stats.errors++;
    return undefined;
  }
}

// Where a stream's records go: the sink on the origin that served the stream (and its token);
// this module's origin when the stream's URL is unknown.
function sinkFor(streamUrl) {
  for (const base of [streamUrl, import.meta.url]) {
    try {
      if (base) return new URL(SINK, base).href;
    } catch (_) {
      // next
    }
  }
  return SINK;
}

// ---------------------------------------------------------------------------------------------
// Long animation frames (or long tasks), for busy_ns.

const busy = []; // [start_ns, end_ns], in arrival order
let busyObserver = null;

function addBusy(entries) {
  for (const entry of entries) {
    const start = Math.round(entry.startTime * 1e6);
    busy.push([start, start + Math.round(entry.duration * 1e6)]);
  }
  const horizon = now() - BUSY_KEEP_NS;
  let drop = Math.max(0, busy.length - BUSY_MAX);
  while (drop < busy.length && busy[drop][1] < horizon) drop++;
  if (drop) busy.splice(0, drop);
}

guard(() => {
  if (typeof PerformanceObserver !== 'function') return;
  const types = PerformanceObserver.supportedEntryTypes || [];
  const type = ['long-animation-frame', 'longtask'].find((t) => types.includes(t));
  if (!type) return;
  busyObserver = new PerformanceObserver((list) => guard(() => addBusy(list.getEntries())));
  busyObserver.observe({ type, buffered: true });
  stats.busySource = type;
});

// Nanoseconds of long frames overlapping [from, to].
function busyBetween(from, to) {
  let total = 0;
  for (const [start, end] of busy) {
    const overlap = Math.min(end, to) - Math.max(start, from);
    if (overlap > 0) total += overlap;
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// Painted frames: fn runs in the first task after the next frame (a requestAnimationFrame
// callback, then a MessageChannel message): the frame's paint is done by then, and a task that
// blocks before a later frame is not charged to the event painted already. One frame callback
// serves everything queued before it fires; FIFO, so an end queued after a render runs after it.

let paintQueue = [];
let paintArmed = false;
const painted = []; // batches whose frame ran, each waiting for its task
let channel = null;

const canPaint = () => raf !== null && document.visibilityState !== 'hidden';

function runPainted() {
  for (const run of painted.shift() || []) guard(run);
}

function afterPaint(fn) {
  paintQueue.push(fn);
  if (paintArmed) return;
  paintArmed = true;
  raf(() => {
    painted.push(paintQueue);
    paintQueue = [];
    paintArmed = false;
    if (!channel && typeof MessageChannel === 'function') {
      channel = new MessageChannel();
      channel.port1.onmessage = runPainted;
    }
    if (channel) channel.port2.postMessage(0);
    else setTimeout(runPainted, 0);
  });
}

// ---------------------------------------------------------------------------------------------
// Pending records, per request, and sending them.

const batches = new Map(); // request id -> Batch
let pendingTotal = 0;
let flushTimer = null;
const backoffs = new Map(); // sink URL -> { until: performance.now() ms, ms: the next wait }
let keepaliveBytes = 0; // bytes of keepalive POST bodies in flight
const inflight = new Set();

class Batch {
  constructor(request, token, sink) {
    this.request = request;
    this.token = token;
    this.sink = sink;
    this.head = `{"request":${JSON.stringify(request)},"token":${JSON.stringify(token)},"records":[`;
    this.headBytes = utf8.encode(this.head).length + 2; // and the closing `]}`
    this.records = [];
    this.ready = 0; // how many records at the front are known ready (old enough)
    this.nextCheck = FLUSH_RECORDS; // records pending before push looks at readiness again
    this.recordBytes = 90; // the mean serialized record, for "a full body is ready"
    // A record is at most ~250 bytes: a head leaving no room for one refuses the request.
    this.refused = this.headBytes + 512 > POST_BYTES;
    if (this.refused) stats.errors++;
    this.open = 0; // streams of this request still recording
  }
}

function batchFor(request, token, sink) {
  let batch = batches.get(request);
  if (!batch || batch.token !== token || batch.sink !== sink) {
    if (batch) flushBatch(batch, { final: true });
    batch = new Batch(request, token, sink);
    batches.set(request, batch);
  }
  return batch;
}

// How many records at the front of the batch are ready: all but a render record young enough
// for its long-frame entries to be missing, and what follows it. Readiness only grows, so the
// scan starts where the last one stopped.
function readyCount(batch) {
  const young = now() - YOUNG_RENDER_NS;
  const records = batch.records;
  let i = batch.ready;
  while (i < records.length && !(records[i].hop === RENDER && records[i].t_ns > young)) i++;
  batch.ready = i;
  return i;
}

// Whether ready records would fill a body (so an early flush sends no small one).
function fullBody(batch, ready) {
  return ready >= POST_RECORDS || batch.headBytes + ready * (batch.recordBytes + 1) >= POST_BYTES;
}

function push(batch, record) {
  if (batch.refused) {
    stats.recordsRefused++;
    return;
  }
  if (pendingTotal >= MAX_PENDING) {
    stats.recordsDropped++;
    return;
  }
  batch.records.push(record);
  pendingTotal++;
  if (batch.records.length >= batch.nextCheck) {
    const ready = readyCount(batch);
    if (ready >= FLUSH_RECORDS && fullBody(batch, ready)) flushBatch(batch, { early: true });
    // Look again after a few more records (not on every one).
    batch.nextCheck = Math.max(FLUSH_RECORDS, batch.records.length + 16);
  }
  if (flushTimer === null) flushTimer = setTimeout(onFlushTimer, FLUSH_MS);
}

function onFlushTimer() {
  flushTimer = null;
  guard(() => {
    for (const batch of [...batches.values()]) flushBatch(batch, {});
    if (pendingTotal > 0 && flushTimer === null) flushTimer = setTimeout(onFlushTimer, FLUSH_MS);
  });
}

function flushAll(options) {
  for (const batch of [...batches.values()]) guard(() => flushBatch(batch, options));
}

function forget(batch) {
  if (batch.open === 0 && batch.records.length === 0 && batches.get(batch.request) === batch) {
    batches.delete(batch.request);
  }
}

function drop(batch, count, counter) {
  stats[counter] += count;
  pendingTotal -= count;
  batch.records.splice(0, count);
  batch.ready = Math.max(0, batch.ready - count);
}

// Sends the batch's ready records (all of them when final) in bodies of at most POST_RECORDS
// records and POST_BYTES bytes; an early flush sends full bodies only and keeps the rest.
function flushBatch(batch, { final = false, beacon = false, early = false }) {
  if (batch.records.length === 0) return forget(batch);
  if (batch.refused) return drop(batch, batch.records.length, 'recordsRefused');
  const backoff = backoffs.get(batch.sink);
  if (backoff && performance.now() < backoff.until) {
    if (beacon) drop(batch, batch.records.length, 'recordsDropped');
    return undefined;
  }
  if (busyObserver) guard(() => addBusy(busyObserver.takeRecords()));
  const ready = final ? batch.records.length : readyCount(batch);
  if (ready === 0) return undefined;

  const records = batch.records;
  const bodies = []; // [body, record count]
  let parts = [];
  let bytes = batch.headBytes;
  let taken = 0; // records in the bodies closed so far
  let serializedBytes = 0;
  const close = () => {
    if (parts.length) bodies.push([batch.head + parts.join(',') + ']}', parts.length]);
    parts = [];
    bytes = batch.headBytes;
  };
  for (let i = 0; i < ready; i++) {
    const json = serialize(records[i]); // ASCII: length is bytes
    serializedBytes += json.length;
    if (parts.length >= POST_RECORDS || bytes + json.length + (parts.length ? 1 : 0) > POST_BYTES) {
      close(); // full
      taken = i;
    }
    bytes += json.length + (parts.length ? 1 : 0);
    parts.push(json);
  }
  batch.recordBytes = Math.max(40, serializedBytes / ready);
  if (early) {
    parts = []; // a body not full waits for more records, or for the timer
  } else {
    close();
    taken = ready;
  }
  if (taken > 0) {
    records.splice(0, taken);
    pendingTotal -= taken;
    batch.ready = Math.max(0, batch.ready - taken);
  }
  for (const [body, count] of bodies) send(batch, body, count, beacon);
  return forget(batch);
}

function serialize(record) {
  const out = { hop: record.hop, seq: record.seq, t_ns: record.t_ns, bytes: record.bytes, kind: record.kind };
  if (record.kind === 'end') {
    out.reason = record.reason;
    out.idle_ns = record.idle_ns;
  }
  if (record.hop === RENDER && record.from !== undefined) {
    const ns = Math.round(busyBetween(record.from, record.t_ns));
    if (ns > 0) out.busy_ns = ns;
  }
  return JSON.stringify(out);
}

// One body, sent once: by beacon when asked (and possible), else by fetch, keepalive while the
// probe's keepalive bodies in flight stay within KEEPALIVE_BYTES (always at a page's leave). A
// fetch that rejects is not retried: a CORS rejection comes after the server took the body.
function send(batch, body, count, beacon) {
  stats.posts++;
  const url = batch.sink;
  if (beacon && typeof navigator !== 'undefined' && typeof navigator.sendBeacon === 'function') {
    let queued = false;
    try {
      queued = navigator.sendBeacon(url, body);
    } catch (_) {
      queued = false;
    }
    if (queued) {
      stats.recordsSent += count;
      return;
    }
    // Not queued (over the beacon quota, or refused): nothing was sent; try a keepalive fetch.
  }
  if (!nativeFetch) {
    stats.recordsDropped += count;
    return;
  }
  const size = utf8.encode(body).length;
  const keepalive = beacon || keepaliveBytes + size <= KEEPALIVE_BYTES;
  if (keepalive) keepaliveBytes += size;
  let sent;
  try {
    sent = nativeFetch
      .call(globalThis, url, {
        method: 'POST',
        body,
        headers: { 'content-type': 'text/plain;charset=UTF-8' },
        keepalive,
        credentials: 'same-origin',
        cache: 'no-store',
      })
      .then(
        (response) => answered(batch, response.status, count),
        () => failed(batch, count),
      );
  } catch (_) {
    sent = Promise.resolve(failed(batch, count));
  }
  sent = sent
    .catch(() => {
      stats.errors++;
    })
    .finally(() => {
      if (keepalive) keepaliveBytes -= size;
      inflight.delete(sent);
    });
  inflight.add(sent);
}

function answered(batch, status, count) {
  if (status >= 200 && status < 300) {
    stats.recordsSent += count;
    backoffs.delete(batch.sink);
  } else if (status === 400 || status === 403 || status === 404 || status === 413) {
    stats.recordsRefused += count;
    batch.refused = true; // stop sending for this request
    if (batch.records.length) drop(batch, batch.records.length, 'recordsRefused');
  } else {
    failed(batch, count); // 429 and anything else: drop, back off
  }
}

// A POST that failed (or was rejected: perhaps after the server took it): its records are
// dropped, never sent again; the next POSTs to that sink wait a while.
function failed(batch, count) {
  stats.recordsDropped += count;
  const backoff = backoffs.get(batch.sink) || { until: 0, ms: BACKOFF_MS[0] };
  backoff.until = performance.now() + backoff.ms;
  backoff.ms = Math.min(backoff.ms * 2, BACKOFF_MS[1]);
  backoffs.set(batch.sink, backoff);
}

/**
 * Sends everything pending now and resolves when those POSTs are answered: waits first (up to
 * `timeoutMs`) for the streams being recorded to end, e.g. for a render end to be painted.
 */
export async function probeFlush(timeoutMs = 3000) {
  try {
    const deadline = performance.now() + timeoutMs;
    while (active.size > 0 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // One more task, so the long frames of the last painted frames are reported.
    await new Promise((resolve) => setTimeout(resolve, END_FLUSH_MS));
    flushAll({ final: true });
    await Promise.allSettled([...inflight]);
  } catch (_) {
    stats.errors++;
  }
}

// ---------------------------------------------------------------------------------------------
// One probed stream: its two hops and their end.

const active = new Set(); // Trackers not yet ended at both hops

class Hop {
  constructor(name, start) {
    this.name = name;
    this.nextSeq = 0;
    this.lastProgress = start; // t_ns of the last visible or hidden record, or the stream's start
    this.lastRecord = start; // t_ns of the last record, for busy_ns
    this.ended = false;
  }
}

class Tracker {
  constructor(request, token, sink) {
    const start = now();
    this.batch = batchFor(request, token, sink);
    this.batch.open++;
    this.recv = new Hop(RECV, start);
    this.render = new Hop(RENDER, start);
    this.lastRecvSeq = null;
    this.errored = false; // an `event: error` came: the stream ends as upstream_error
    this.ending = false; // end() was called
    stats.streams++;
    active.add(this);
  }

  record(hop, seq, bytes, kind, t = now()) {
    const record = { hop: hop.name, seq, t_ns: t, bytes, kind };
    if (hop === this.render) record.from = hop.lastRecord;
    hop.lastRecord = t;
    if (kind !== 'control') hop.lastProgress = t;
    hop.nextSeq = seq + 1;
    push(this.batch, record);
  }

  // An event parsed from the network: its client.recv record, and what its render needs. `id`
  // is null for an event without an id of its own (or a non-numeric one); an id equal to the
  // last recorded one (an EventSource's lastEventId persists) is not recorded twice.
  received(id, bytes, kind) {
    if (this.recv.ended) return null;
    if (id === null || id === this.lastRecvSeq) {
      stats.eventsWithoutId++;
      return null;
    }
    this.lastRecvSeq = id;
    stats.eventsRecorded++;
    this.record(this.recv, id, bytes, kind);
    return { seq: id, bytes, kind };
  }

  // An `event: error` was received (and recorded): the network side ends as upstream_error, and
  // so will the render side, whatever ends the stream for the app (an SDK throws and aborts).
  upstreamError() {
    this.errored = true;
    this.endHop(this.recv, 'upstream_error');
  }

  // Events the app is done with: their client.render records once the next frame is painted.
  handled(events) {
    if (events.length === 0 || this.render.ended || !canPaint()) return;
    afterPaint(() => {
      if (this.render.ended) return;
      const t = now();
      for (const e of events) this.record(this.render, e.seq, e.bytes, e.kind, t);
    });
  }

  endHop(hop, reason, t = now()) {
    if (hop.ended) return;
    hop.ended = true;
    if (this.errored) reason = 'upstream_error';
    const record = { hop: hop.name, seq: hop.nextSeq, t_ns: t, bytes: 0, kind: 'end', reason, idle_ns: Math.max(0, t - hop.lastProgress) };
    if (hop === this.render) record.from = hop.lastRecord;
    push(this.batch, record);
  }

  // The network side ended (the body ended or failed): the recv end record only.
  endRecv(reason) {
    this.endHop(this.recv, reason);
  }

  // The stream ended for the app: recv now (if the network had not ended it); render once what
  // was handled is painted (now when the page cannot paint).
  end(reason) {
    if (this.ending) return;
    this.ending = true;
    this.endHop(this.recv, reason);
    const done = () => {
      this.endHop(this.render, reason);
      if (!active.delete(this)) return;
      this.batch.open--;
      const batch = this.batch;
      setTimeout(() => guard(() => flushBatch(batch, { final: true })), END_FLUSH_MS);
    };
    if (canPaint()) afterPaint(done);
    else done();
  }

  // The page is being left: end now, without waiting for a frame.
  abandon() {
    this.end('consumer_gone');
    if (!this.render.ended) {
      this.endHop(this.render, 'consumer_gone');
      if (active.delete(this)) this.batch.open--;
    }
  }
}

// Hidden (another tab, a minimized window) is not gone: the streams go on, and may be shown
// again; only send what is pending, while the page surely still runs.
function onHidden() {
  guard(() => flushAll({ final: true }));
}

// Leaving the page (navigation, closing the tab; also into the back-forward cache): what is
// still recording ends as consumer_gone, and everything pending goes by beacon.
function onLeave() {
  guard(() => {
    for (const tracker of [...active]) guard(() => tracker.abandon());
    flushAll({ final: true, beacon: true });
  });
}

if (hasWindow) {
  guard(() => {
    addEventListener('pagehide', onLeave);
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'hidden') onHidden();
    });
  });
}

// ---------------------------------------------------------------------------------------------
// SSE splitting on bytes (WHATWG rules: LF, CRLF or CR line ends, also split across reads; one
// leading BOM; `field: value` with one optional space; comments; multi-line data; the last
// event id persists, an id holding NUL is ignored; an event ends at a blank line) and the
// server's kind marks (a `:hidden` or `:control` comment line in the event's block).
//
// Linear in the input however it is split: each read is scanned once, the unfinished block is
// kept as a list of pieces (joined once, when its blank line comes), and an unfinished line is
// joined once, when its line end comes.

const LF = 10;
const CR = 13;
const COLON = 58;
const SPACE = 32;
const DATA = [100, 97, 116, 97];
const ID = [105, 100];
const EVENT = [101, 118, 101, 110, 116];
const ERROR = [101, 114, 114, 111, 114];
const DONE = [91, 68, 79, 78, 69, 93];
const HIDDEN = [104, 105, 100, 100, 101, 110];
const CONTROL = [99, 111, 110, 116, 114, 111, 108];
const BOM = [0xef, 0xbb, 0xbf];

function bytesEqual(buf, start, end, want) {
  if (end - start !== want.length) return false;
  for (let i = 0; i < want.length; i++) if (buf[start + i] !== want[i]) return false;
  return true;
}

// The pieces joined (a copy, when `copy` or more than one).
function concat(pieces, total, copy = false) {
  if (pieces.length === 1) return copy ? pieces[0].slice() : pieces[0];
  const out = new Uint8Array(total);
  let at = 0;
  for (const piece of pieces) {
    out.set(piece, at);
    at += piece.length;
  }
  return out;
}

class SseSplitter {
  // onEvent({ id, bytes, done, mark, error }) -> info | null, per dispatched event: `id` the
  // last event id as a number when the event had an `id:` field of its own (null otherwise, or
  // when not a decimal integer), `bytes` its data's UTF-8 length, `done` data is `[DONE]`,
  // `mark` 'hidden' | 'control' | null, `error` its type is `error`.
  // `limit`: an unfinished block that reaches this many bytes before its blank line sets
  // `overflowed`, and the splitter stops (its events are not dispatched; rest() has the bytes).
  constructor(onEvent, limit = Infinity) {
    this.onEvent = onEvent;
    this.limit = limit;
    this.overflowed = false;
    this.block = []; // pieces of the block being read (not yet emitted)
    this.pending = 0; // their bytes
    this.line = []; // pieces of the unfinished line
    this.lineBytes = 0;
    this.skipLF = false; // the last line ended in a CR at the end of a read
    this.first = true; // the first line may start with a BOM
    this.lastId = null; // the last event id (a number, or null when not numeric), persisting
    this.events = []; // infos of the events of the block being read
    this.resetEvent();
  }

  resetEvent() {
    this.dataLines = 0;
    this.dataBytes = 0;
    this.done = false;
    this.ownId = false; // the event's block had a (valid) id field
    this.mark = null;
    this.error = false;
  }

  // Appends bytes; returns the complete blocks as chunks { bytes, events }. If it throws, the
  // splitter holds all the bytes it had and `value` (for rest()), none of them emitted.
  push(value) {
    const block = this.block.slice();
    const pending = this.pending;
    try {
      return this.split(value);
    } catch (error) {
      this.block = [...block, value];
      this.pending = pending + value.length;
      throw error;
    }
  }

  split(value) {
    const chunks = [];
    const n = value.length;
    let pos = 0;
    if (this.skipLF && n > 0) {
      this.skipLF = false;
      if (value[0] === LF) pos = 1; // the rest of a CRLF: belongs to the next block's bytes
    }
    let blockStart = 0;
    let lineStart = pos;
    for (let i = pos; i < n; i++) {
      const b = value[i];
      if (b !== LF && b !== CR) continue;
      if (this.pending + i - blockStart >= this.limit) {
        this.overflowed = true;
        break;
      }
      let next = i + 1;
      if (b === CR) {
        if (next < n) {
          if (value[next] === LF) next++;
        } else {
          this.skipLF = true;
        }
      }
      if (this.completeLine(value, lineStart, i)) {
        // A blank line: the block (and the event, if it has data) is complete.
        this.block.push(value.subarray(blockStart, next));
        chunks.push({ bytes: concat(this.block, this.pending + next - blockStart, true), events: this.events });
        this.block = [];
        this.pending = 0;
        this.events = [];
        blockStart = next;
      }
      lineStart = next;
      i = next - 1;
    }
    if (lineStart < n && !this.overflowed) {
      this.line.push(value.subarray(lineStart));
      this.lineBytes += n - lineStart;
    }
    if (blockStart < n) {
      this.block.push(value.subarray(blockStart));
      this.pending += n - blockStart;
    }
    if (this.pending >= this.limit) this.overflowed = true;
    return chunks;
  }

  // A line ended at value[end]; returns whether it was blank (after dispatching its event).
  completeLine(value, start, end) {
    let buf = value.subarray(start, end);
    if (this.line.length) {
      this.line.push(buf);
      buf = concat(this.line, this.lineBytes + buf.length);
      this.line = [];
      this.lineBytes = 0;
    }
    if (this.first) {
      this.first = false;
      if (bytesEqual(buf, 0, Math.min(3, buf.length), BOM)) buf = buf.subarray(3);
    }
    if (buf.length > 0) {
      this.field(buf);
      return false;
    }
    if (this.dataLines > 0) {
      const info = this.onEvent({
        id: this.ownId ? this.lastId : null,
        bytes: this.dataBytes + this.dataLines - 1,
        done: this.done,
        mark: this.mark,
        error: this.error,
      });
      if (info) this.events.push(info);
    }
    this.resetEvent();
    return true;
  }

  field(buf) {
    const end = buf.length;
    if (buf[0] === COLON) {
      // A comment; `:hidden` and `:control` mark the event's kind.
      if (bytesEqual(buf, 1, end, HIDDEN)) this.mark = 'hidden';
      else if (bytesEqual(buf, 1, end, CONTROL)) this.mark = 'control';
      return;
    }
    let colon = 0;
    while (colon < end && buf[colon] !== COLON) colon++;
    let value = Math.min(colon + 1, end);
    if (colon < end && value < end && buf[value] === SPACE) value++;
    if (bytesEqual(buf, 0, colon, DATA)) {
      this.dataLines++;
      this.dataBytes += end - value;
      this.done = this.dataLines === 1 && bytesEqual(buf, value, end, DONE);
    } else if (bytesEqual(buf, 0, colon, EVENT)) {
      this.error = bytesEqual(buf, value, end, ERROR);
    } else if (bytesEqual(buf, 0, colon, ID)) {
      // An id field that holds NUL is ignored (WHATWG); any other sets the last event id.
      if (buf.subarray(value, end).includes(0)) return;
      let id = null;
      let digits = value < end;
      for (let i = value; i < end; i++) if (buf[i] < 48 || buf[i] > 57) digits = false;
      if (digits) {
        let text = '';
        for (let i = value; i < end; i++) text += String.fromCharCode(buf[i]);
        const n = Number(text);
        if (Number.isSafeInteger(n)) id = n;
      }
      this.lastId = id;
      this.ownId = true;
    }
  }

  // What is left (an unfinished block: at the body's end the SSE rules drop its event), as one
  // chunk; the splitter is empty after.
  rest() {
    const rest = this.pending ? concat(this.block, this.pending, true) : null;
    this.block = [];
    this.pending = 0;
    this.line = [];
    this.lineBytes = 0;
    this.events = [];
    this.resetEvent();
    return rest ? { bytes: rest, events: [] } : null;
  }
}

// probedFetch

/**
 * A drop-in `fetch`. A response with the `x-streamgate-probe` header and a `text/event-stream`
 * body comes back as a Response whose body yields one chunk per SSE event (the same bytes),
 * recording client.recv and client.render per event; any other response comes back untouched.
 */
export async function probedFetch(input, init) {
  if (!nativeFetch) throw new TypeError('fetch is not available');
  const response = await nativeFetch.call(globalThis, input, init);
  let probed = response;
  guard(() => {
    probed = wrapResponse(response, input, init) || response;
  });
  return probed;
}

function wrapResponse(response, input, init) {
  if (!response.body) return null;
  const type = (response.headers.get('content-type') || '').toLowerCase();
  if (!type.startsWith('text/event-stream')) return null;
  const token = response.headers.get(TOKEN_HEADER);
  const request = response.headers.get(ID_HEADER);
  if (!token || !request) {
    stats.unprobed++;
    return null;
  }
  const signal = (init && init.signal) || (typeof Request === 'function' && input instanceof Request ? input.signal : null);
  const tracker = new Tracker(request, token, sinkFor(response.url));
  const body = probedBody(response.body, tracker, signal);
  const wrapped = new Response(body, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
  for (const key of ['url', 'redirected', 'type']) {
    Object.defineProperty(wrapped, key, { value: response[key], configurable: true });
  }
  return wrapped;
}

// The body, one chunk per SSE block. A read-ahead loop reads the upstream body as it arrives
// (recording client.recv as each event is parsed) into a queue the app's reads take from, while
// the queue is within READ_AHEAD_EVENTS and, with the unfinished block, READ_AHEAD_BYTES. When
// the app pulls the next chunk it is done with the previous one (for a lazy reader: handled
// it): that chunk's events get their client.render records.
function probedBody(upstream, tracker, signal) {
  const reader = upstream.getReader();
  let recording = true; // false after an internal error: pass the bytes through only
  const splitter = new SseSplitter((event) => {
    // The server's kinds: its mark, else control for `[DONE]` and `event: error`.
    const kind = event.error ? 'control' : event.mark || (event.done ? 'control' : 'visible');
    const info = tracker.received(event.id, event.bytes, kind);
    if (event.error) tracker.upstreamError();
    return info;
  }, READ_AHEAD_BYTES);
  const queue = []; // chunks read and parsed, not yet handed to the app
  let queuedBytes = 0;
  let handed = []; // the events of the chunk the app has now
  let state = 'reading'; // then 'done' (body ended), 'failed' (body errored), 'closed' (for the app)
  let failure = null; // the upstream error, for the app once the queue is drained...
  let failureReason = null; // ...and the end reason it gives
  let reading = false; // readAhead is running
  let wake = null; // resolves a read of the app waiting for the queue
  let controller = null;

  const notify = () => {
    const resolve = wake;
    wake = null;
    if (resolve) resolve();
  };
  const enqueue = (chunk) => {
    queue.push(chunk);
    queuedBytes += chunk.bytes.length;
  };
  const discard = () => {
    state = 'closed';
    queue.length = 0;
    queuedBytes = 0;
    handed = [];
    notify();
  };

  async function readAhead() {
    if (reading) return;
    reading = true;
    try {
      while (
        state === 'reading' &&
        queue.length < READ_AHEAD_EVENTS &&
        queuedBytes + splitter.pending < READ_AHEAD_BYTES
      ) {
        let result;
        try {
          result = await reader.read();
        } catch (error) {
          if (state !== 'reading') break;
          const gone = (signal && signal.aborted) || (error && error.name === 'AbortError');
          state = 'failed';
          failure = error;
          failureReason = gone ? 'consumer_gone' : 'upstream_error';
          guard(() => tracker.endRecv(failureReason));
          break;
        }
        if (state !== 'reading') break; // cancelled or aborted meanwhile
        if (result.done) {
          const rest = recording ? splitter.rest() : null;
          if (rest) enqueue(rest);
          state = 'done';
          guard(() => tracker.endRecv('completed'));
        } else if (!recording) {
          enqueue({ bytes: result.value, events: [] });
        } else {
          try {
            for (const chunk of splitter.push(result.value)) enqueue(chunk);
            if (splitter.overflowed) {
              // No blank line in 1 MiB: stop recording; what the splitter held passes on as is.
              stats.oversized++;
              recording = false;
              const rest = splitter.rest();
              if (rest) enqueue(rest);
            }
          } catch (_) {
            stats.errors++;
            recording = false;
            // Whatever the splitter held (this chunk's bytes are in it, or in the chunks
            // enqueued): the bytes pass through unchanged.
            const rest = splitter.rest();
            if (rest) enqueue(rest);
          }
        }
        notify();
      }
    } catch (_) {
      stats.errors++;
    } finally {
      reading = false;
      notify();
    }
  }

  // The app aborted the fetch: its reads fail now, as they would without the probe.
  const aborted = () =>
    guard(() => {
      tracker.end('consumer_gone');
      if (state === 'closed') return;
      const reason = signal.reason !== undefined ? signal.reason : new DOMException('The operation was aborted.', 'AbortError');
      discard();
      controller.error(reason);
    });

  const body = new ReadableStream(
    {
      start(c) {
        controller = c;
      },
      async pull(c) {
        // The app pulls again: it is done with the previous chunk (its events were recorded at
        // recv, even if recording stopped since).
        guard(() => tracker.handled(handed));
        handed = [];
        while (queue.length === 0 && state === 'reading') {
          readAhead();
          await new Promise((resolve) => {
            wake = resolve;
          });
        }
        if (state === 'closed') return;
        if (queue.length) {
          const chunk = queue.shift();
          queuedBytes -= chunk.bytes.length;
          handed = chunk.events;
          c.enqueue(chunk.bytes);
          readAhead(); // below the bound again
        } else if (state === 'done') {
          state = 'closed';
          guard(() => tracker.end('completed'));
          c.close();
        } else {
          state = 'closed';
          guard(() => tracker.end(failureReason));
          c.error(failure);
        }
      },
      cancel(reason) {
        discard();
        guard(() => tracker.end('consumer_gone'));
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
  if (signal && typeof signal.addEventListener === 'function') {
    if (signal.aborted) aborted();
    else signal.addEventListener('abort', aborted, { once: true });
  }
  readAhead();
  return body;
}

// ---------------------------------------------------------------------------------------------
// probeEventSource

/**
 * `new EventSource(url, init)`, recorded as the stream `{ request, token }` (from the first
 * response's `x-request-id` and `x-streamgate-probe`): recv before the app's listeners run,
 * render when they have returned and the next frame is painted, `lastEventId` as seq.
 * `close()` ends it as consumer_gone; the stream's end (the first `error` event) as completed,
 * or upstream_error when the browser gives up (readyState CLOSED) or the server sent an
 * `event: error`. Every event is `visible` (bar `[DONE]`): a page never sees the kind marks. A reconnection is not
 * recorded. Without a token it is a plain EventSource.
 */
export function probeEventSource(url, ids, init) {
  const source = new EventSource(url, init);
  guard(() => {
    const { request, token } = ids || {};
    if (request && token) attachSource(source, String(request), String(token));
  });
  return source;
}

function attachSource(source, request, token) {
  const tracker = new Tracker(request, token, sinkFor(source.url));
  const add = EventTarget.prototype.addEventListener;
  const hooked = new Set();
  // lastEventId persists across events: an event without an id of its own repeats the last one,
  // which received() does not record twice. Comments (the kind marks) never reach a page.
  const onEvent = (event, error = false) =>
    guard(() => {
      const text = String(event.lastEventId);
      const id = /^[0-9]+$/.test(text) && Number.isSafeInteger(Number(text)) ? Number(text) : null;
      const data = typeof event.data === 'string' ? event.data : '';
      const kind = error || data === '[DONE]' ? 'control' : 'visible';
      const info = tracker.received(id, utf8.encode(data).length, kind);
      if (error) tracker.upstreamError();
      // Dispatch is one task: a frame requested now comes after every listener returned.
      if (info) tracker.handled([info]);
    });
  // Our listener goes first for each type the app listens to, so recv precedes the app's.
  const hook = (type) => {
    if (hooked.has(type) || type === 'open' || type === 'error') return;
    hooked.add(type);
    add.call(source, type, onEvent);
  };
  hook('message');
  add.call(source, 'error', (event) =>
    guard(() => {
      // The server's `event: error` is a MessageEvent named error: recorded, and the end.
      if (typeof MessageEvent === 'function' && event instanceof MessageEvent) onEvent(event, true);
      tracker.end(source.readyState === EventSource.CLOSED ? 'upstream_error' : 'completed');
    }),
  );
  const nativeAdd = source.addEventListener;
  source.addEventListener = function (type, listener, options) {
    guard(() => hook(String(type)));
    return nativeAdd.call(this, type, listener, options);
  };
  const nativeClose = source.close;
  source.close = function () {
    guard(() => tracker.end('consumer_gone'));
    return nativeClose.call(this);
  };
}
