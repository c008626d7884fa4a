-- wrk script for benches/http_peers.sh: GET / with an `x-client` header.
--
-- WRK_KEYS (environment): how many client keys, default 10000. Each request
-- picks one at random ("c1" .. "cN"); with WRK_KEYS=1 every request carries the
-- single hot key "hot". The requests are formatted once per thread in init(), so
-- request() costs one table lookup and keeps wrk's own CPU use low.
--
-- WRK_SEQ=1 (environment): the keys in order instead of at random ("c1", "c2",
-- ... then "c1" again), so a warm-up of at least WRK_KEYS requests (on one
-- thread) has seen every key.
--
-- done() prints one parseable line:
--   RESULT requests=N duration_us=N non2xx=N connect=N read=N write=N timeout=N
--          p50_us=N p90_us=N p99_us=N max_us=N
-- (wrk counts any status above 399 in errors.status, shown here as non2xx.)

local keys = tonumber(os.getenv("WRK_KEYS") or "10000")
local seq = os.getenv("WRK_SEQ") == "1"
local next_key = 0
local reqs = {}
local thread_ids = 0

function setup(thread)
  thread_ids = thread_ids + 1
  thread:set("tid", thread_ids)
end

function init(args)
  math.randomseed(os.time() * 1000 + (tid or 0))
  if keys <= 1 then
    reqs[1] = wrk.format("GET", "/", { ["x-client"] = "hot" })
    keys = 1
  else
    for i = 1, keys do
      reqs[i] = wrk.format("GET", "/", { ["x-client"] = "c" .. i })
    end
  end
end

function request()
  if seq then
    next_key = next_key % keys + 1
    return reqs[next_key]
  end
  return reqs[math.random(keys)]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d " ..
    "p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
