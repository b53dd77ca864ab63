-- wrk script: POST /charges with a fresh Idempotency-Key per request. wrk runs for a
-- fixed duration (BENCH_SECONDS), as pgbench -T does for the floor.
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + id)
  wrk.method = "POST"
  wrk.body = '{"amountCents":4900,"currency":"EUR"}'
  wrk.headers["Content-Type"] = "application/json"
end

local function uuid4()
  local template = "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"
  return (template:gsub("[xy]", function(c)
    local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
    return string.format("%x", v)
  end))
end

function request()
  wrk.headers["Idempotency-Key"] = uuid4()
  return wrk.format()
end


function done(summary, latency, requests)
  io.write(string.format("BENCH requests=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
