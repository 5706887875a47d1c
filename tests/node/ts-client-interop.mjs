#!/usr/bin/env node
// Interop check: the official TypeScript client (@durable-streams/client 0.2.7, pinned in
// package-lock.json) writing and reading a JSON stream on any Durable Streams server.
//
// Usage:
//   node ts-client-interop.mjs --base http://127.0.0.1:4437 --stream NAME [--messages 300]
//                              [--read-only] [--timeout-ms 20000]
//   node ts-client-interop.mjs --print-messages [--messages 300]
//
// Without --read-only: creates NAME as a JSON stream (DurableStream.create), starts two live
// readers from offset -1 (stream() with live "long-poll" and live "sse"), appends --messages
// messages with IdempotentProducer (small maxBatchBytes, so many batches, pipelined 5 at a time),
// in three bursts (one synchronous loop, one spread over event-loop turns so that lingerMs seals
// batches, one after an explicit flush()), then close()s the producer with a final message
// "bye" (appended atomically with the close: EOF). With --read-only the stream must exist and be
// closed already (written by another client); the live readers then start on the closed stream.
//
// Then it reads the stream back with stream(): the live readers must see the closure, and a
// catch-up read (live: false) reads everything up to date. `ended` tells whether the read
// session ended by itself (no cancel needed). --print-messages prints the messages the writer
// appends (as a JSON array, "bye" last), so another writer can append the very same values.
//
// Prints ONE JSON object on stdout:
//   { "written": {"messages", "batches", "epoch", "finalOffset", "lastSuccessfulOffset"} | null,
//     "head": {"offset", "streamClosed", "contentType"},
//     "reads": { "longPoll" | "sse" | "catchup": {
//         "items": [...], "batches": [{"count", "offset", "upToDate", "streamClosed"}],
//         "offset", "streamClosed", "ended" } } }
// and exits 0; on any error it prints {"error": "..."} and exits 1.
import { parseArgs } from "node:util"
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"

const { values } = parseArgs({
  options: {
    base: { type: `string` },
    stream: { type: `string` },
    messages: { type: `string`, default: `300` },
    "read-only": { type: `boolean`, default: false },
    "timeout-ms": { type: `string`, default: `20000` },
    "print-messages": { type: `boolean`, default: false },
  },
  allowPositionals: false,
})

if (values[`print-messages`]) {
  // The messages this script writes (the final one included), for a writer in another language.
  const all = Array.from({ length: Number(values.messages) }, (_, i) => message(i))
  process.stdout.write(JSON.stringify([...all, `bye`]) + `\n`)
  process.exit(0)
}
if (!values.base || !values.stream) {
  console.error(`usage: node ts-client-interop.mjs --base URL --stream NAME [--messages N] [--read-only]`)
  process.exit(2)
}
const url = `${values.base.replace(/\/+$/, ``)}/v1/stream/${values.stream}`
const total = Number(values.messages)
const timeoutMs = Number(values[`timeout-ms`])
const readOnly = values[`read-only`]

// The messages: JSON values of several kinds (objects, arrays, strings, numbers, null, booleans,
// non-ASCII text), most of them carrying their position, so a duplicate or a reordering shows.
function message(i) {
  switch (i % 6) {
    case 0:
      return { i, s: `x`.repeat(i % 7) }
    case 1:
      return [i, `a`, { n: null }]
    case 2:
      return `message ${i} — grüße ✓ 😀`
    case 3:
      return i + 0.5
    case 4:
      return { i, nested: { ok: i % 2 === 0, list: [1, 2, 3] }, empty: {} }
    default:
      return i % 4 === 1 ? null : i % 4 === 3
  }
}

function withTimeout(promise, ms, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no end within ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

// Follow the stream with stream() and subscribeJson() from offset -1. `done` resolves with what
// was seen at the batch that ends the read: for live: false the first up-to-date batch, for the
// live modes the batch that reports the stream's closure. (The session's own `closed` promise
// settles when the session stops fetching, which can be before the subscriber has been handed
// the last batches, so it only serves to surface errors here.)
async function follow(live) {
  const res = await stream({ url, offset: `-1`, live, json: true, warnOnHttp: false })
  const seen = { items: [], batches: [], offset: res.offset, streamClosed: false, ended: false }
  let end
  let fail
  const done = new Promise((resolve, reject) => {
    end = resolve
    fail = reject
  })
  res.subscribeJson((batch) => {
    seen.items.push(...batch.items)
    if (batch.items.length > 0 || batch.streamClosed) {
      seen.batches.push({
        count: batch.items.length,
        offset: batch.offset,
        upToDate: batch.upToDate,
        streamClosed: batch.streamClosed,
      })
    }
    seen.offset = batch.offset
    seen.streamClosed = seen.streamClosed || batch.streamClosed
    if (live === false ? batch.upToDate : batch.streamClosed) end(seen)
  })
  res.closed.then(
    () => {
      seen.ended = true
    },
    (err) => fail(err)
  )
  return { res, done }
}

// Wait for a reader's last batch; then give its session a moment to end by itself (`ended`:
// no further request once the closure or, for catch-up, up-to-date was seen) before cancelling.
async function finish(reader, what) {
  try {
    const seen = await withTimeout(reader.done, timeoutMs, what)
    await withTimeout(reader.res.closed, 2000, `${what} session`).catch(() => {})
    return seen
  } finally {
    reader.res.cancel()
  }
}
async function write() {
  const handle = await DurableStream.create({ url, contentType: `application/json`, warnOnHttp: false })
  const longPoll = await follow(`long-poll`)
  const sse = await follow(`sse`)
  const errors = []
  const producer = new IdempotentProducer(handle, `ts-interop`, {
    maxBatchBytes: 1024, // many small batches...
    maxInFlight: 5, // ...pipelined
    lingerMs: 5,
    onError: (err) => errors.push(String(err)),
  })
  const first = Math.floor(total / 3)
  const second = Math.floor((2 * total) / 3)
  for (let i = 0; i < first; i++) producer.append(JSON.stringify(message(i)))
  for (let i = first; i < second; i++) {
    producer.append(JSON.stringify(message(i)))
    if (i % 10 === 0) await new Promise((r) => setTimeout(r, 1)) // let lingerMs seal batches
  }
  await producer.flush()
  for (let i = second; i < total; i++) producer.append(JSON.stringify(message(i)))
  const closed = await producer.close(JSON.stringify(`bye`))
  if (errors.length) throw new Error(`producer errors: ${errors.join(`; `)}`)
  return {
    written: {
      messages: total + 1,
      batches: producer.nextSeq - 1, // seqs used by append batches (the close took the last)
      epoch: producer.epoch,
      finalOffset: closed.finalOffset,
      lastSuccessfulOffset: producer.lastSuccessfulOffset,
    },
    longPoll,
    sse,
  }
}

async function main() {
  let written = null
  let longPoll
  let sse
  if (readOnly) {
    longPoll = await follow(`long-poll`)
    sse = await follow(`sse`)
  } else {
    ;({ written, longPoll, sse } = await write())
  }
  const reads = {}
  reads.longPoll = await finish(longPoll, `live long-poll read`)
  reads.sse = await finish(sse, `live SSE read`)
  reads.catchup = await finish(await follow(false), `catch-up read`)
  const head = await DurableStream.head({ url, warnOnHttp: false })
  if (!head.exists) throw new Error(`HEAD ${url}: stream not found`)
  const summary = {
    written,
    head: { offset: head.offset, streamClosed: head.streamClosed, contentType: head.contentType },
    reads,
  }
  process.stdout.write(JSON.stringify(summary) + `\n`)
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stdout.write(JSON.stringify({ error: String(err?.stack ?? err) }) + `\n`)
    process.exit(1)
  }
)
