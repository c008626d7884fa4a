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
--             many units below zero: the reserved tokens are due later; -1 on
--             every quota for an adjustment after the fact, see `adjust`).
--             Compact form, when every decision is a check (no debt) of the
--             first quota alone: -D, then per decision only its cost. It
--             decides exactly as the long form (n = 1, cost, 1, 0) would, with
--             three arguments fewer per decision for Redis to parse and hand
--             over.
--
-- Decisions are made in order, each seeing the buckets as the ones before it
-- left them; a denied decision changes nothing. A bucket is stored as
-- "<level>:<stamp>" (integers; the level is negative while reserved tokens are
-- owed) with a TTL that lasts until it is full again, plus a margin of 1 ms, so
-- an idle client's key disappears exactly when forgetting it changes nothing.
--
-- Reply, per decision: allowed (1/0), then per quota: remaining, wait_us,
-- reset_after_us; all integers below 2^53, sent as one string of
-- little-endian doubles (struct.pack "<d" each; see the end), which loses
-- nothing.
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
now = now[1] * 1000000 + now[2]

-- A key outlives its bucket's refill by this many milliseconds. Redis expires
-- keys by the clock TIME reads, in whole milliseconds, and only once their
-- last millisecond has passed; the TTL is the refill rounded up to the
-- millisecond. Redis counts PX from when the command runs: on 7.0 when SET
-- runs (after TIME), on 7.2 and later from when this script call began (just
-- before TIME). With 1 ms more, a key lasts until its bucket is full unless
-- Redis stalls for over a millisecond between starting the call and reading
-- TIME; then it may read full that stall early, so at most that much refill
-- is given early. (The test variant, whose clock is not Redis's, keeps keys
-- 1 s longer: src/store/redis/script.rs.)
local MARGIN_MS = 1 -- tollgate:margin

-- Integers (all below 2^53) are written with %d where a C long holds them
-- (every 64-bit build: exact, and much cheaper than %.0f), else with %.0f.
local INT = "%.0f"
if format("%d", 2 ^ 53) == "9007199254740992" then
  INT = "%d"
end
local VALUE = INT .. ":" .. INT

-- Numbers arrive as strings. Arithmetic converts one (`s + 0`) with a single
-- strtod, where tonumber() runs two; most are "0" or "1" (one quota, cost 1,
-- no debt), and those are looked up instead of converted.
local known = { ["0"] = 0, ["1"] = 1 }

local nq = ARGV[2] + 0
local fulls, nums, dens = {}, {}, {}
local a = 3
for q = 1, nq do
  fulls[q], nums[q], dens[q] = ARGV[a] + 0, ARGV[a + 1] + 0, ARGV[a + 2] + 0
  a = a + 3
end

-- The bucket stored at key, refilled up to now: level, stamp, and whether it
-- was stored (a missing or unreadable value is a full bucket).
local function stored_bucket(key, full, num)
  local stored = call("GET", key) -- tollgate:get
  if stored then
    local sep = find(stored, ":", 1, true)
    local level = sep and tonumber(sub(stored, 1, sep - 1))
    local stamp = sep and tonumber(sub(stored, sep + 1))
    -- tonumber also reads "nan" and "inf": x - x is 0 only for a finite x.
    if level and stamp and level - level == 0 and stamp - stamp == 0 then
      if level > full then
        level = full
      end
      if now > stamp then
        -- Compare before multiplying so the product stays below 2^53:
        -- refilled to full once the gap covers ceil((full - level) / num).
        local missing = full - level
        local t = floor(missing / num)
        if t * num < missing then
          t = t + 1
        end
        if now - stamp >= t then
          level = full
        else
          level = level + (now - stamp) * num
        end
        stamp = now
      end
      -- A clock behind the stamp (failover) refills nothing and keeps it.
      return level, stamp, true
    end
  end
  return full, now, false
end

local reply, r, k = {}, 0, 1

-- The debt a reservation may take on in a bucket stamped at `stamp`: a clock
-- behind the stamp (failover) makes every wait start from the stamp, so the
-- time ahead comes off the debt, and the wait stays within max_wait.
local function debt_at(debt, stamp, num)
  if debt > 0 and stamp > now then
    local ahead = stamp - now
    if ahead * num >= debt then
      return 0
    end
    return debt - ahead * num
  end
  return debt
end

-- Spends from one bucket of a decision (if it is admitted and costs
-- something), writes it back with its TTL, and appends its figures to the
-- reply: remaining, wait_us, reset_after_us.
local function finish(key, q, level, stamp, need, allowed, cost)
  local full, num, den = fulls[q], nums[q], dens[q]
  -- A clock behind the stamp refills nothing until it reaches the stamp, so
  -- waits start from the stamp.
  local ahead = stamp - now
  local wait = 0
  if allowed then
    if cost > 0 then
      level = level - need
    end
    if level < 0 then
      local t = floor(-level / num)
      if t * num < -level then
        t = t + 1
      end
      wait = ahead + t
    end
  elseif level < need then
    local x = need - level
    local t = floor(x / num)
    if t * num < x then
      t = t + 1
    end
    wait = ahead + t
  end
  -- ceil((full - level) / num): when the bucket is full again, counted from
  -- the stamp; the key lives that long plus MARGIN_MS.
  local missing = full - level
  local reset = floor(missing / num)
  if reset * num < missing then
    reset = reset + 1
  end
  if allowed and cost > 0 then
    local ms = reset + ahead
    local ttl = floor(ms / 1000)
    if ttl * 1000 < ms then
      ttl = ttl + 1
    end
    call("SET", key, format(VALUE, level, stamp), "PX", format(INT, ttl + MARGIN_MS)) -- tollgate:set
  end
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

-- An adjustment after the fact (debt -1), decided by a response: cost
-- tokens spent from the bucket (a charge) or, when cost is negative, given
-- back to it (a refund), whatever its level. A refund fills the bucket up to
-- full at most, so it never admits more than if the refunded request had
-- never come; a charge takes it into debt down to -full at most (one
-- bucket's worth, the most one request may cost), which the next admission
-- waits to see refilled. Always applied; the reply is that of an admitted
-- check of nothing. A bucket not stored that ends full is not written: it
-- stays as it was.
local function adjust(key, q, cost)
  local full, num, den = fulls[q], nums[q], dens[q]
  local level, stamp, stored = stored_bucket(key, full, num)
  -- Exact wherever the clamps do not apply: both operands are below 2^53.
  level = level - cost * den
  if level > full then
    level = full
  elseif level < -full then
    level = -full
  end
  if stored or level < full then
    finish(key, q, level, stamp, 0, true, 1)
  else
    finish(key, q, level, stamp, 0, true, 0)
  end
end

local nd = ARGV[a] + 0
a = a + 1
if nd < 0 then
  -- The compact form: checks of quota 1, one key each, the common case under
  -- load. The steps of stored_bucket and finish, written out for one quota
  -- without debt (no function calls, no per-quota lookups: about 5% of what
  -- a decision costs Redis). Keep them in step with those two;
  -- tests/redis_store.rs (the_compact_form_decides_as_the_long_form) compares
  -- the two forms on random calls.
  local full, num, den = fulls[1], nums[1], dens[1]
  -- Stored values and TTLs as text, by level (for buckets stamped now) and by
  -- TTL: under load most checks of a call leave their bucket at the same
  -- level with the same TTL, and formatting numbers is a large part of what
  -- a write costs.
  local at_now, ttls = {}, {}
  for i = 1, -nd do
    local cost = known[ARGV[a]] or ARGV[a] + 0
    a = a + 1
    local need = cost * den
    if need > full then
      return redis.error_reply("ERR tollgate: cost exceeds capacity")
    end
    local key = KEYS[i]
    -- stored_bucket
    local level, stamp = full, now
    local stored = call("GET", key) -- tollgate:compact-get
    if stored then
      local sep = find(stored, ":", 1, true)
      local l = sep and tonumber(sub(stored, 1, sep - 1))
      local s = sep and tonumber(sub(stored, sep + 1))
      if l and s and l - l == 0 and s - s == 0 then
        level, stamp = l, s
        if level > full then
          level = full
        end
        if now > stamp then
          local missing = full - level
          local t = floor(missing / num)
          if t * num < missing then
            t = t + 1
          end
          if now - stamp >= t then
            level = full
          else
            level = level + (now - stamp) * num
          end
          stamp = now
        end
      end
    end
    -- finish
    local ahead = stamp - now
    local wait, allowed = 0, level >= need
    if allowed then
      level = level - need
    else
      local x = need - level
      local t = floor(x / num)
      if t * num < x then
        t = t + 1
      end
      wait = ahead + t
    end
    local missing = full - level
    local reset = floor(missing / num)
    if reset * num < missing then
      reset = reset + 1
    end
    if allowed and cost > 0 then
      local ms = reset + ahead
      local ttl = floor(ms / 1000)
      if ttl * 1000 < ms then
        ttl = ttl + 1
      end
      local value
      if stamp == now then
        value = at_now[level]
        if not value then
          value = format(VALUE, level, stamp)
          at_now[level] = value
        end
      else
        value = format(VALUE, level, stamp)
      end
      local px = ttls[ttl]
      if not px then
        px = format(INT, ttl + MARGIN_MS)
        ttls[ttl] = px
      end
      call("SET", key, value, "PX", px) -- tollgate:compact-set
    end
    if reset > 0 then
      reset = reset + ahead
    end
    local remaining = 0
    if level > 0 then
      remaining = floor(level / den)
    end
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] =
      allowed and 1 or 0, remaining, wait, reset
    r = r + 4
  end
else
  -- A decision over one quota (the common case) is decided at once; one over
  -- several reads all its buckets first, since it is admitted only if every
  -- bucket holds the cost. Per quota of such a decision: index, level, stamp.
  local qs, lv, st = {}, {}, {}
  for _ = 1, nd do
    local n, cost = known[ARGV[a]] or ARGV[a] + 0, known[ARGV[a + 1]] or ARGV[a + 1] + 0
    if n == 1 then
      local q, debt = known[ARGV[a + 2]] or ARGV[a + 2] + 0, known[ARGV[a + 3]] or ARGV[a + 3] + 0
      a = a + 4
      local full, need = fulls[q], cost * dens[q]
      if debt < 0 then
        r = r + 1
        reply[r] = 1
        adjust(KEYS[k], q, cost)
      else
        if need > full then
          return redis.error_reply("ERR tollgate: cost exceeds capacity")
        end
        local key = KEYS[k]
        local level, stamp = stored_bucket(key, full, nums[q])
        local allowed = level - need >= -debt_at(debt, stamp, nums[q])
        r = r + 1
        reply[r] = allowed and 1 or 0
        finish(key, q, level, stamp, need, allowed, cost)
      end
      k = k + 1
    elseif (known[ARGV[a + 3]] or ARGV[a + 3] + 0) < 0 then
      -- An adjustment of several quotas: each bucket on its own.
      a = a + 2
      r = r + 1
      reply[r] = 1
      for i = 1, n do
        adjust(KEYS[k + i - 1], known[ARGV[a]] or ARGV[a] + 0, cost)
        a = a + 2
      end
      k = k + n
    else
      a = a + 2
      local allowed = true
      for i = 1, n do
        local q, debt = known[ARGV[a]] or ARGV[a] + 0, known[ARGV[a + 1]] or ARGV[a + 1] + 0
        a = a + 2
        local full, need = fulls[q], cost * dens[q]
        if need > full then
          return redis.error_reply("ERR tollgate: cost exceeds capacity")
        end
        local level, stamp = stored_bucket(KEYS[k + i - 1], full, nums[q])
        qs[i], lv[i], st[i] = q, level, stamp
        if level - need < -debt_at(debt, stamp, nums[q]) then
          allowed = false
        end
      end
      r = r + 1
      reply[r] = allowed and 1 or 0
      for i = 1, n do
        local q = qs[i]
        finish(KEYS[k + i - 1], q, lv[i], st[i], cost * dens[q], allowed, cost)
      end
      k = k + n
    end
  end
end

-- The reply goes back as one string of little-endian doubles (exact: every
-- number is an integer below 2^53): one bulk string costs the client one
-- read, where a list of integers costs it a parse per number, and it costs
-- Redis less to send than a table. unpack() puts each value on Lua's stack,
-- so a long reply is packed in chunks.
if r <= 1024 then
  return struct.pack("<" .. string.rep("d", r), unpack(reply, 1, r))
end
local parts = {}
for i = 1, r, 1024 do
  local j = i + 1023
  if j > r then
    j = r
  end
  parts[#parts + 1] = struct.pack("<" .. string.rep("d", j - i + 1), unpack(reply, i, j))
end
return table.concat(parts)
