-- wrk script for the soak: mixed traffic. Of every 20 requests, 16 are new charges,
-- 3 replay a recent key with its body, 1 reuses a recent key with another amount
-- (a 422). Counts answers by class so the soak can assert that none was a 5xx.
local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

-- The last 64 new keys, filled contiguously so that #recent never counts a hole.
local recent = {}
local created = 0
local n = 0
by_status = {}  -- global: done() reads it from every thread with thread:get

local function uuid4()
  return (("xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx"):gsub("[xy]", function(c)
    local v = (c == "x") and math.random(0, 15) or math.random(8, 11)
    return string.format("%x", v)
  end))
end

function init(args)
  math.randomseed(os.time() * 1000 + id)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  n = n + 1
  local slot = n % 20
  local key, amount
  if slot < 16 or #recent == 0 then
    key, amount = uuid4(), 4900
    recent[(created % 64) + 1] = key
    created = created + 1
  elseif slot < 19 then
    key, amount = recent[math.random(1, #recent)], 4900
  else
    key, amount = recent[math.random(1, #recent)], 5000
  end
  wrk.headers["Idempotency-Key"] = key
  wrk.body = '{"amountCents":' .. amount .. ',"currency":"EUR"}'
  return wrk.format()
end

function response(status, headers, body)
  by_status[status] = (by_status[status] or 0) + 1
end

function done(summary, latency, requests)
  local totals = {}
  for _, thread in ipairs(threads) do
    local counts = thread:get("by_status")
    for status, count in pairs(counts) do totals[status] = (totals[status] or 0) + count end
  end
  local line = "BENCH requests=" .. summary.requests
  local server_errors = 0
  for status, count in pairs(totals) do
    line = line .. " s" .. status .. "=" .. count
    if status >= 500 then server_errors = server_errors + count end
  end
  io.write(line .. " server_errors=" .. server_errors ..
    " socket_errors=" .. (summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout) .. "\n")
end
