-- wrk script: replays of completed keys read from BENCH_KEYS_FILE (one key per line),
-- a random one per request, with the body they were completed with. With the API's
-- replay cache off, every replay reads its key's row: the cost of a lookup in a
-- large key index.
local threads = {}
local keys = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + id)
  for line in io.lines(os.getenv("BENCH_KEYS_FILE")) do
    keys[#keys + 1] = line
  end
  wrk.method = "POST"
  wrk.body = '{"amountCents":4900,"currency":"EUR"}'
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  wrk.headers["Idempotency-Key"] = keys[math.random(1, #keys)]
  return wrk.format()
end

function done(summary, latency, requests)
  io.write(string.format("BENCH requests=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
