-- wrk script for bench/server/bench.py and make demo: args "search" [SEED
-- [DIM]] (POST /search with one of 64 random vectors, k 10) or "healthz"
-- (GET /healthz); prints a parseable summary line (@wrk ...).
local bodies = {}
local n = 0
local mode = "search"
init = function(args)
  mode = args[1] or "search"
  if mode ~= "search" then return end
  math.randomseed(7 + (tonumber(args[2]) or 0))
  local dim = tonumber(args[3]) or 64
  for b = 1, 64 do
    local v = {}
    for i = 1, dim do v[i] = string.format("%.4f", math.random() * 2 - 1) end
    bodies[b] = '{"vector": [' .. table.concat(v, ", ") .. '], "k": 10}'
  end
end
request = function()
  if mode ~= "search" then
    return wrk.format("GET", "/healthz")
  end
  n = n % 64 + 1
  return wrk.format("POST", "/search", {["Content-Type"] = "application/json"},
                    bodies[n])
end
done = function(s, latency, requests)
  local e = s.errors
  io.write(string.format("@wrk %d %.1f %.3f %.3f %.3f %d %d\n", s.requests,
    s.requests / (s.duration / 1e6), latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, e.status,
    e.connect + e.read + e.write + e.timeout))
end
