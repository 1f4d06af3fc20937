-- wrk script: GET /healthz, with the summary line of search.lua.
wrk.path = "/healthz"
done = function(s, latency, requests)
  local e = s.errors
  io.write(string.format("@wrk %d %.1f %.3f %.3f %.3f %d %d\n", s.requests,
    s.requests / (s.duration / 1e6), latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, e.status,
    e.connect + e.read + e.write + e.timeout))
end
