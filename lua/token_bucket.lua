-- tollgate: exact token buckets, one or more decisions per call, each over one
-- or more quotas of one client. The same algorithm as src/store/bucket.rs; keep
-- the two in step (tests/model.rs checks both against an independent model).
--
-- KEYS        the buckets of every decision, in order: one key per quota of the
--             decision, all with the client's {hash tag} (one cluster slot).
-- ARGV[1]     reserved, "". This script always takes the clock from Redis TIME;
--             only the variant that the `test-util` cargo feature builds for
--             tests (another script, with its own SHA) reads a clock from here.
-- ARGV[2]     Q, the number of quota descriptions that follow.
-- ARGV[3..]   per quota: full (capacity x den), num, den. The refill is num/den
--             tokens per microsecond; levels are kept in units of 1/den token, so
--             every refill is an exact integer. Quota checks keep full and num at
--             most 2^52, so every number below stays under 2^53, exact in Lua's
--             doubles.
-- then        D, the number of decisions, and per decision: n (its quotas), cost
--             (tokens to spend from every bucket; 0 = peek, writes nothing), then
--             per quota: its index in the quota list, and the debt the bucket may
--             take on (0 for a check; for a reservation, the level may go that
--             many units below zero: the reserved tokens are due later).
--
-- Decisions are made in order, each seeing the buckets as the ones before it
-- left them; a denied decision changes nothing. A bucket is stored as
-- "<level>:<stamp>" (integers; the level is negative while reserved tokens are
-- owed) with a TTL that lasts until it is full again, plus a margin, so an idle
-- client's key disappears exactly when forgetting it changes nothing.
--
-- Reply, per decision: allowed (1/0), then per quota: remaining, wait_us,
-- reset_after_us; all integers, so Redis's number conversion loses nothing.
-- wait_us is, for a denied decision, the time until this bucket would hold the
-- cost (0 if it does); for an admitted reservation, the time until the debt it
-- took on is paid (0 for a plain check).

-- Effects replication: a script that reads TIME must replicate its writes, not
-- itself (the default since Redis 5; harmless where it is already on).
if redis.replicate_commands then
  redis.replicate_commands()
end

local call, floor, tonumber, find, sub, format =
  redis.call, math.floor, tonumber, string.find, string.sub, string.format

local now = redis.call("TIME") -- tollgate:clock
now = tonumber(now[1]) * 1000000 + tonumber(now[2])

-- ceil(x / y) for x >= 0, y > 0, exact below 2^53.
local function ceil_div(x, y)
  local q = floor(x / y)
  if q * y < x then
    q = q + 1
  end
  return q
end

local nq = tonumber(ARGV[2])
local fulls, nums, dens = {}, {}, {}
local a = 3
for q = 1, nq do
  fulls[q], nums[q], dens[q] = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
end

local reply, r, k = {}, 0, 1
local nd = tonumber(ARGV[a])
a = a + 1
-- Per quota of the decision at hand: its index, level and stamp.
local qs, lv, st = {}, {}, {}
for _ = 1, nd do
  local n, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local allowed = 1
  for i = 1, n do
    local q, debt = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    a = a + 2
    local full, need = fulls[q], cost * dens[q]
    if need > full then
      return redis.error_reply("ERR tollgate: cost exceeds capacity")
    end
    local level, stamp = full, now
    local stored = call("GET", KEYS[k + i - 1])
    if stored then
      local sep = find(stored, ":", 1, true)
      local l = sep and tonumber(sub(stored, 1, sep - 1))
      local s = sep and tonumber(sub(stored, sep + 1))
      if l and s then
        level, stamp = l, s
        if level > full then
          level = full
        end
        if now > stamp then
          -- Compare before multiplying so the product stays below 2^53.
          if now - stamp >= ceil_div(full - level, nums[q]) then
            level = full
          else
            level = level + (now - stamp) * nums[q]
          end
          stamp = now
        end
        -- A clock behind the stamp (failover) refills nothing and keeps it.
      end
    end
    qs[i], lv[i], st[i] = q, level, stamp
    if level - need < -debt then
      allowed = 0
    end
  end
  r = r + 1
  reply[r] = allowed
  for i = 1, n do
    local q, level, stamp = qs[i], lv[i], st[i]
    local full, num, den = fulls[q], nums[q], dens[q]
    local need = cost * den
    -- A clock behind the stamp refills nothing until it reaches the stamp, so
    -- waits start from the stamp.
    local ahead = stamp - now
    local wait = 0
    if allowed == 1 then
      if cost > 0 then
        level = level - need
        local ttl = ceil_div(ceil_div(full - level, num) + ahead, 1000) + 1000
        call("SET", KEYS[k + i - 1], format("%.0f:%.0f", level, stamp), "PX", ttl)
      end
      if level < 0 then
        wait = ahead + ceil_div(-level, num)
      end
    elseif level < need then
      wait = ahead + ceil_div(need - level, num)
    end
    local reset = ceil_div(full - level, num)
    if reset > 0 then
      reset = reset + ahead
    end
    local remaining = 0
    if level > 0 then
      remaining = floor(level / den)
    end
    reply[r + 1], reply[r + 2], reply[r + 3] = remaining, wait, reset
    r = r + 3
  end
  k = k + n
end
return reply
