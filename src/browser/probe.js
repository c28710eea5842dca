// streamgate browser probe: the user's screen as a measured hop.
//
// Served by streamgate's servers at `GET /streamgate/probe.js`. A dependency-free ES module:
// no build step, nothing global, and it never throws into the page.
//
// For every SSE event of a probed stream (one whose response carries `x-request-id` and
// `x-streamgate-probe: <token>`) it records, with no payload text, only the event's id, size,
// kind and time:
//
//   client.recv    the event was parsed from the network (probedFetch reads the body ahead of
//                  the app, up to READ_AHEAD_EVENTS / READ_AHEAD_BYTES, so an app that is slow
//                  to ask for the next event shows at client.render, not here);
//   client.render  the app's handler for it returned and the next frame was painted (the first
//                  task after a requestAnimationFrame), with `busy_ns`: how long long animation
//                  frames (or long tasks) overlapped the time since the previous render record;
//
// and one `end` record per hop when the stream ends. Records are batched and POSTed as
// `text/plain` JSON to `/streamgate/hop-records` on the origin that served this module
// (fetch with keepalive; sendBeacon for what is pending when the page is hidden or left).
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
// most 256 records and 64 KiB):
//   {"hop":"client.recv"|"client.render","seq":<event id>,"t_ns":<performance.now() in ns>,
//    "bytes":<UTF-8 length of data>,"kind":"visible"|"control"}  (+ "busy_ns" on render)
//   {..., "kind":"end","reason":"completed"|"consumer_gone"|"upstream_error","idle_ns":<ns>}

const SINK = '/streamgate/hop-records';
const TOKEN_HEADER = 'x-streamgate-probe';
const ID_HEADER = 'x-request-id';
const RECV = 'client.recv';
const RENDER = 'client.render';

const FLUSH_MS = 1000; // flush pending records this often...
const FLUSH_RECORDS = 128; // ...or when a request has this many pending
const POST_RECORDS = 256; // at most this many records...
const POST_BYTES = 64 * 1024; // ...and bytes per POST
const MAX_PENDING = 10000; // past this, new records are dropped (and counted)
const YOUNG_RENDER_NS = 250e6; // a render record this young waits for its long-frame entries
const END_FLUSH_MS = 100; // after a stream's end, so the last frame's entries are in
const BACKOFF_MS = [2000, 60000]; // after a 429 or a failed POST: first, most
const BUSY_KEEP_NS = 300e9; // long-frame entries older than this are forgotten
const BUSY_MAX = 2000; // and at most this many are kept
// probedFetch reads the network ahead of the app while fewer than this many events (blocks),
// and fewer than this many of their bytes, are parsed but not yet taken by the app; past
// either (by at most one network read) it stops reading until the app takes one, so a slow app
// still holds the body back and the server feels it, as without the probe.
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
  eventsWithoutId: 0, // events with no numeric id (not recorded)
  recordsSent: 0, // records in POSTs answered 204 (or beacons queued)
  recordsRefused: 0, // records in POSTs answered 400/403/404/413, or for a refused request
  recordsDropped: 0, // records lost: memory bound, 429, network error, beacon refused
  posts: 0, // POSTs and beacons made
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

function sinkUrl() {
  try {
    return new URL(SINK, import.meta.url).href;
  } catch (_) {
    return SINK;
  }
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
let backoffUntil = 0; // performance.now() ms
let backoffMs = BACKOFF_MS[0];
const inflight = new Set();

class Batch {
  constructor(request, token) {
    this.request = request;
    this.token = token;
    this.records = [];
    this.refused = false;
    this.open = 0; // streams of this request still recording
  }
}

function batchFor(request, token) {
  let batch = batches.get(request);
  if (!batch || batch.token !== token) {
    if (batch) flushBatch(batch, { final: true });
    batch = new Batch(request, token);
    batches.set(request, batch);
  }
  return batch;
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
  if (batch.records.length >= FLUSH_RECORDS) flushBatch(batch, {});
  else if (flushTimer === null) flushTimer = setTimeout(onFlushTimer, FLUSH_MS);
}

function onFlushTimer() {
  flushTimer = null;
  guard(() => {
    for (const batch of batches.values()) flushBatch(batch, {});
    if (pendingTotal > 0 && flushTimer === null) flushTimer = setTimeout(onFlushTimer, FLUSH_MS);
  });
}

function forget(batch) {
  if (batch.open === 0 && batch.records.length === 0 && batches.get(batch.request) === batch) {
    batches.delete(batch.request);
  }
}

function drop(batch, count, counter) {
  stats[counter] += count;
  pendingTotal -= count;
  batch.records.length = 0;
}

// Sends batch's ready records: all of them when final, else all but the young render records
// (whose long-frame entries may not have been reported yet).
function flushBatch(batch, { final = false, beacon = false }) {
  if (batch.records.length === 0) return forget(batch);
  if (batch.refused) return drop(batch, batch.records.length, 'recordsRefused');
  if (performance.now() < backoffUntil) {
    if (beacon) drop(batch, batch.records.length, 'recordsDropped');
    return undefined;
  }
  if (busyObserver) guard(() => addBusy(busyObserver.takeRecords()));
  let ready = batch.records.length;
  if (!final) {
    const young = now() - YOUNG_RENDER_NS;
    const first = batch.records.findIndex((r) => r.hop === RENDER && r.t_ns > young);
    if (first >= 0) ready = first;
  }
  if (ready === 0) return undefined;
  const records = batch.records.splice(0, ready);
  pendingTotal -= records.length;

  const head = `{"request":${JSON.stringify(batch.request)},"token":${JSON.stringify(batch.token)},"records":[`;
  const headBytes = utf8.encode(head).length + 2;
  let parts = [];
  let bytes = headBytes;
  const post = () => {
    if (parts.length) send(batch, head + parts.join(',') + ']}', parts.length, beacon);
    parts = [];
    bytes = headBytes;
  };
  for (const record of records) {
    const json = serialize(record); // ASCII: length is bytes
    if (headBytes + json.length > POST_BYTES) {
      stats.recordsDropped++;
      continue;
    }
    if (parts.length >= POST_RECORDS || bytes + json.length + 1 > POST_BYTES) post();
    parts.push(json);
    bytes += json.length + 1;
  }
  post();
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

function send(batch, body, count, beacon) {
  stats.posts++;
  const url = sinkUrl();
  if (beacon && typeof navigator !== 'undefined' && typeof navigator.sendBeacon === 'function') {
    if (navigator.sendBeacon(url, body)) stats.recordsSent += count;
    else stats.recordsDropped += count;
    return;
  }
  if (!nativeFetch) {
    stats.recordsDropped += count;
    return;
  }
  const post = (keepalive) =>
    nativeFetch.call(globalThis, url, {
      method: 'POST',
      body,
      headers: { 'content-type': 'text/plain;charset=UTF-8' },
      keepalive,
      credentials: 'same-origin',
      cache: 'no-store',
    });
  // keepalive fetches share a small in-flight quota: past it they fail, so try once without.
  const sent = post(true)
    .catch(() => post(false))
    .then(
      (response) => answered(batch, response.status, count),
      () => failed(count),
    )
    .catch(() => {
      stats.errors++;
    })
    .finally(() => inflight.delete(sent));
  inflight.add(sent);
}

function answered(batch, status, count) {
  if (status >= 200 && status < 300) {
    stats.recordsSent += count;
    backoffMs = BACKOFF_MS[0];
  } else if (status === 400 || status === 403 || status === 404 || status === 413) {
    stats.recordsRefused += count;
    batch.refused = true; // stop sending for this request
    if (batch.records.length) drop(batch, batch.records.length, 'recordsRefused');
  } else {
    failed(count); // 429 and anything else: drop, back off
  }
}

function failed(count) {
  stats.recordsDropped += count;
  backoffUntil = performance.now() + backoffMs;
  backoffMs = Math.min(backoffMs * 2, BACKOFF_MS[1]);
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
    for (const batch of [...batches.values()]) flushBatch(batch, { final: true });
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
    this.lastProgress = start; // t_ns of the last visible record, or the stream's start
    this.lastRecord = start; // t_ns of the last record, for busy_ns
    this.ended = false;
  }
}

class Tracker {
  constructor(request, token) {
    const start = now();
    this.batch = batchFor(request, token);
    this.batch.open++;
    this.recv = new Hop(RECV, start);
    this.render = new Hop(RENDER, start);
    this.lastRecvSeq = null;
    this.ending = false; // end() was called
    stats.streams++;
    active.add(this);
  }

  record(hop, seq, bytes, kind, t = now()) {
    const record = { hop: hop.name, seq, t_ns: t, bytes, kind };
    if (hop === this.render) record.from = hop.lastRecord;
    hop.lastRecord = t;
    if (kind === 'visible') hop.lastProgress = t;
    hop.nextSeq = seq + 1;
    push(this.batch, record);
  }

  // An event parsed from the network: its client.recv record, and what its render needs.
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

  // Events whose handling is done: their client.render records once the next frame is painted.
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

  // The page was hidden or left: end now, without waiting for a frame.
  abandon() {
    this.end('consumer_gone');
    if (!this.render.ended) {
      this.endHop(this.render, 'consumer_gone');
      if (active.delete(this)) this.batch.open--;
    }
  }
}

function onHidden() {
  guard(() => {
    for (const tracker of [...active]) tracker.abandon();
    for (const batch of [...batches.values()]) flushBatch(batch, { final: true, beacon: true });
  });
}

if (hasWindow) {
  guard(() => {
    addEventListener('pagehide', onHidden);
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'hidden') onHidden();
    });
  });
}

// ---------------------------------------------------------------------------------------------
// SSE splitting on bytes (WHATWG rules: LF, CRLF or CR line ends; `field: value` with one
// optional space; comments; multi-line data; an event ends at a blank line).

const LF = 10;
const CR = 13;
const COLON = 58;
const SPACE = 32;
const DATA = [100, 97, 116, 97];
const ID = [105, 100];
const DONE = [91, 68, 79, 78, 69, 93];
const BOM = [0xef, 0xbb, 0xbf];

function bytesEqual(buf, start, end, want) {
  if (end - start !== want.length) return false;
  for (let i = 0; i < want.length; i++) if (buf[start + i] !== want[i]) return false;
  return true;
}

class SseSplitter {
  constructor(onEvent) {
    this.onEvent = onEvent; // (id | null, dataBytes, isDone) -> info | null
    this.buf = new Uint8Array(0); // bytes of the block being read (not yet emitted)
    this.scan = 0; // where the next line starts in buf
    this.skipLF = false; // the last line ended in a CR at the end of a chunk
    this.first = true; // a BOM may come
    this.resetEvent();
  }

  resetEvent() {
    this.dataLines = 0;
    this.dataBytes = 0;
    this.done = false;
    this.id = null;
  }

  // Appends bytes; returns the complete blocks as chunks { bytes, events }.
  push(value) {
    const buf = new Uint8Array(this.buf.length + value.length);
    buf.set(this.buf, 0);
    buf.set(value, this.buf.length);
    this.buf = buf;
    if (this.first) {
      let n = 0;
      while (n < BOM.length && n < buf.length && buf[n] === BOM[n]) n++;
      if (n < BOM.length && n === buf.length) return []; // maybe a BOM, wait
      this.first = false;
      if (n === BOM.length) this.scan = n;
    }
    const chunks = [];
    let events = [];
    let pos = this.scan;
    if (this.skipLF && pos < buf.length) {
      if (buf[pos] === LF) pos++;
      this.skipLF = false;
    }
    let blockStart = 0;
    for (;;) {
      let end = pos;
      while (end < buf.length && buf[end] !== LF && buf[end] !== CR) end++;
      if (end === buf.length) break;
      let next = end + 1;
      if (buf[end] === CR) {
        if (next < buf.length) {
          if (buf[next] === LF) next++;
        } else {
          this.skipLF = true;
        }
      }
      if (end === pos) {
        // A blank line: the block (and the event, if it has data) is complete.
        if (this.dataLines > 0) {
          const info = this.onEvent(this.id, this.dataBytes + this.dataLines - 1, this.done);
          if (info) events.push(info);
        }
        this.resetEvent();
        chunks.push({ bytes: buf.slice(blockStart, next), events });
        events = [];
        blockStart = next;
      } else {
        this.line(buf, pos, end);
      }
      pos = next;
    }
    this.buf = buf.slice(blockStart);
    this.scan = pos - blockStart;
    return chunks;
  }

  line(buf, start, end) {
    if (buf[start] === COLON) return; // a comment
    let colon = start;
    while (colon < end && buf[colon] !== COLON) colon++;
    let value = Math.min(colon + 1, end);
    if (colon < end && value < end && buf[value] === SPACE) value++;
    if (bytesEqual(buf, start, colon, DATA)) {
      this.dataLines++;
      this.dataBytes += end - value;
      this.done = this.dataLines === 1 && bytesEqual(buf, value, end, DONE);
    } else if (bytesEqual(buf, start, colon, ID)) {
      let id = null;
      let digits = value < end;
      for (let i = value; i < end; i++) if (buf[i] < 48 || buf[i] > 57) digits = false;
      if (digits) {
        let text = '';
        for (let i = value; i < end; i++) text += String.fromCharCode(buf[i]);
        const n = Number(text);
        if (Number.isSafeInteger(n)) id = n;
      }
      // An id field that holds NUL is ignored (WHATWG); any other replaces the event's id.
      if (!buf.subarray(value, end).includes(0)) this.id = id;
    }
  }

  // What is left at the body's end (an unterminated block: the SSE rules drop its event).
  rest() {
    const rest = this.buf;
    this.buf = new Uint8Array(0);
    return rest.length ? { bytes: rest, events: [] } : null;
  }
}

// ---------------------------------------------------------------------------------------------
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
  const tracker = new Tracker(request, token);
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
// the queue is within READ_AHEAD_EVENTS and READ_AHEAD_BYTES. When the app asks for the next
// chunk it has handled the previous one: that chunk's events get their client.render records.
function probedBody(upstream, tracker, signal) {
  const reader = upstream.getReader();
  let recording = true; // false after an internal error: pass the bytes through only
  const splitter = new SseSplitter((id, bytes, done) =>
    tracker.received(id, bytes, done ? 'control' : 'visible'),
  );
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
      while (state === 'reading' && queue.length < READ_AHEAD_EVENTS && queuedBytes < READ_AHEAD_BYTES) {
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
          } catch (_) {
            stats.errors++;
            recording = false;
            // Whatever the splitter held, then this chunk: the bytes pass through unchanged.
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
        // The app asks again: it has handled the previous chunk.
        if (recording) guard(() => tracker.handled(handed));
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
 * or upstream_error when the browser gives up (readyState CLOSED). A reconnection is not
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
  const tracker = new Tracker(request, token);
  const add = EventTarget.prototype.addEventListener;
  const hooked = new Set();
  const onEvent = (event) =>
    guard(() => {
      const text = String(event.lastEventId);
      const id = /^[0-9]+$/.test(text) && Number.isSafeInteger(Number(text)) ? Number(text) : null;
      const data = typeof event.data === 'string' ? event.data : '';
      const info = tracker.received(id, utf8.encode(data).length, data === '[DONE]' ? 'control' : 'visible');
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
  add.call(source, 'error', () =>
    guard(() => tracker.end(source.readyState === EventSource.CLOSED ? 'upstream_error' : 'completed')),
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
