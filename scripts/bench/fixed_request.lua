-- wrk script: the same request over and over (a replay with a fixed key, or the
-- trivial health endpoint), for a fixed duration.
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  local key = os.getenv("BENCH_KEY")
  if key and key ~= "" then
    wrk.method = "POST"
    wrk.body = '{"amountCents":4900,"currency":"EUR"}'
    wrk.headers["Content-Type"] = "application/json"
    wrk.headers["Idempotency-Key"] = key
  end
end


function done(summary, latency, requests)
  io.write(string.format("BENCH requests=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
