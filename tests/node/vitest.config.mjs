import { defineConfig } from "vitest/config"

// Only the conformance entry point; vitest defaults otherwise (5 s per-test
// timeout, same as upstream's `server-conformance-tests --run` CLI), so the
// results are comparable with the official runner. Override the timeout with
// CONFORMANCE_TEST_TIMEOUT_MS if you need to debug a slow server.
//
// JSON report:  npx vitest run --reporter=default --reporter=json --outputFile=reports/conformance.json
const testTimeout = process.env.CONFORMANCE_TEST_TIMEOUT_MS
  ? Number(process.env.CONFORMANCE_TEST_TIMEOUT_MS)
  : undefined

export default defineConfig({
  test: {
    include: [`conformance.test.mjs`],
    ...(testTimeout ? { testTimeout } : {}),
    // The suite talks to an external server; never run files in watch mode by accident.
    watch: false,
  },
})
