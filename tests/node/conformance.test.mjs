// Durable Streams conformance suite (pinned @durable-streams/server-conformance-tests
// 0.3.6) run against an already-running server.
//
//   CONFORMANCE_BASE_URL=http://127.0.0.1:8787 npx vitest run
//
// Optional:
//   CONFORMANCE_LONG_POLL_TIMEOUT_MS  forwarded as longPollTimeoutMs (suite default 20000);
//                                     only used by the suite to size long-poll test timeouts.
//
//   CONFORMANCE_SUBSCRIPTIONS=true   also runs the six subscription tests (`subscriptions`
//                                     option); the server must accept loopback webhooks
//                                     (`stations serve --webhooks-allow-loopback`).
// We call runConformanceTests() from a local test file because
// `npx server-conformance-tests --run URL` finds no test files in a plain
// project (upstream issue 284).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_BASE_URL

if (!baseUrl) {
  throw new Error(
    `CONFORMANCE_BASE_URL is required, e.g. CONFORMANCE_BASE_URL=http://127.0.0.1:4437 npx vitest run`
  )
}

const options = { baseUrl: baseUrl.replace(/\/+$/, ``) }

if (process.env.CONFORMANCE_LONG_POLL_TIMEOUT_MS) {
  options.longPollTimeoutMs = Number(process.env.CONFORMANCE_LONG_POLL_TIMEOUT_MS)
}

if (process.env.CONFORMANCE_SUBSCRIPTIONS === `true`) {
  options.subscriptions = true
}

runConformanceTests(options)
