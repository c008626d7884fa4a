-- tollgate: exact token buckets, one or more decisions per call, each over one
-- or more quotas of one client. The same algorithm as src/store/bucket.rs; keep
-- the two in step (tests/model.rs checks both against an independent model).
--
-- KEYS        the buckets of every decision, in order: one key per quota of the
--             decision, all with the client's {hash tag} (one cluster slot);
--             then, unless ARGV[1] is "", the epoch key.
-- ARGV[1]     the server's epoch as the caller knows it (see "Epochs"): ""
--             for none (no epoch key is declared or read), "0" when the
--             caller has seen none yet, else what the last reply ended
--             with (2 x epoch + 1); "!" before it also
--             checks the server's identity (INFO run_id), as a store does on
--             every new connection. This script always takes the clock from
--             Redis TIME; only the variant that the `test-util` cargo feature
--             builds for tests (another script, with its own SHA) reads a
--             clock from here instead, and has no epoch.
-- ARGV[2]     Q, the number of quota descriptions that follow; -Q when some
--             quota has a lock-out, and each description has a fourth number.
-- ARGV[3..]   per quota: full (capacity x den), num, den. The refill is num/den
--             tokens per microsecond; levels are kept in units of 1/den token, so
--             every refill is an exact integer. Quota checks keep full and num at
--             most 2^52, so every number below stays under 2^53, exact in Lua's
--             doubles. With -Q, then the lock-out in microseconds (0: none;
--             its refill, lock-out x num, is at most 2^52 too). See "Lock-outs".
-- then        D, the number of decisions, and per decision: n (its quotas), cost
--             (tokens to spend from every bucket; 0 = peek, writes nothing), then
--             per quota: its index in the quota list, and the debt the bucket may
--             take on (0 for a check; for a reservation, the level may go that
--             many units below zero: the reserved tokens are due later; -1 on
--             every quota for an adjustment after the fact, see `adjust`;
--             -2 on every quota for a lease, then nine more arguments: the
--             hold's id, the most tokens wanted, its lifetime in
--             microseconds, a report it carries: a hold's id ("0":
--             none) and what it spent (negative: a partial report, which
--             keeps the rest of the hold), its roomy size and lifetime (0 0:
--             none), asked for instead when every bucket is at least 3/4 free
--             besides the cost, and a second report ("0" 0: none), partial,
--             of another hold; -3 on every quota for a lease's report, then the
--             hold's id, the cost being the tokens it spent. See "Leases").
--             Compact form, when every decision is a check (no debt) of the
--             first quota alone: -D, then per decision only its cost. It
--             decides exactly as the long form (n = 1, cost, 1, 0) would, with
--             three arguments fewer per decision for Redis to parse and hand
--             over.
--
-- Decisions are made in order, each seeing the buckets as the ones before it
-- left them; a denied decision changes nothing. A bucket is stored as
-- "<level>:<stamp>:<full>,<num>" (integers; the level is negative while
-- reserved tokens are owed; full and num are those of the quota it was
-- written under) with a TTL that lasts until it is full again, plus a margin
-- of 1 ms, so an idle client's key disappears exactly when forgetting it
-- changes nothing.
--
-- Changed quotas: the key of a named policy's bucket names its quota's
-- period, not its figures (src/policy.rs, `carries`), so a quota changed to
-- other figures over the same period (a reload, a deploy, instances of both
-- during a rolling deploy) reads the buckets kept under the old ones. A bucket written under other figures is refilled
-- under them up to now (so it is full when its key would have expired), its
-- holds debited whole (their holders counted under the old figures), and
-- carried into the quota's (`carry`): the same share of the capacity, so a
-- client that had spent its burst has none of the new one. Every check
-- (never a peek) writes a carried bucket back under its own figures,
-- admitted or refused, so the old rate stops at the first; the figures are
-- a bucket's units ("full,num"), so quotas that count alike (`5/min` and
-- `60/min`) carry nothing and a refusal writes nothing; an adjustment
-- carries it back and keeps it under its figures (see `adjust`). A value
-- without figures (two fields) is taken as the quota's own.
--
-- Lock-outs: a decision that a bucket of a quota with a lock-out refuses
-- (not one refused by the other quotas alone) locks that bucket out, unless
-- its stamp is ahead of the clock already (a lock-out under way is not
-- extended): the stamp moves to the lock-out's end and the level to the
-- refused cost, so nothing refills before the end and the cost is back
-- exactly at it; only when that is no sooner than the cost would have been
-- back anyway, and not while learning (see "Epochs": the stand-in hold may
-- be what refused). For such a quota the time a stamp is ahead counts as debt in full
-- (nothing is admitted before it, but a reservation that may wait that long),
-- and it is reported as waited and as nothing remaining. A refusal that
-- locks a bucket out writes every bucket of its decision. Only the long form
-- carries such quotas, and never a lease. As `spent` in src/store/bucket.rs.
--
-- Leases: a bucket may carry holds, each "id,h,e" (h units of the level set
-- aside for one instance until e, a microsecond of this clock), stored after
-- the figures: "<level>:<stamp>:<full>,<num>:<id,h,e>;<id,h,e>". The level refills as ever,
-- capped at full with the holds inside it; a check may spend only what is
-- not held (level - held). A lease spends its cost like a check and, if
-- admitted, sets aside a hold of at most half of what is then left, and at
-- most what it asks for (a grant of 0 when that is under one token, or when
-- the bucket has MAX_HOLDS holds). Its holder spends the held tokens in
-- process and reports what it spent: the report debits the spent tokens
-- (never more than the hold) and releases the rest. A hold whose expiry
-- passed before its report is debited whole, when the bucket is next read
-- (refilled first, then debited). A lease whose id the bucket already holds
-- was run before (a resent call): it is answered as admitted with that
-- hold, and spends nothing again; a report of an id it does not hold does
-- nothing. Every admission in process is backed by a token of the level
-- that nobody else can spend, so the bucket's bound holds as without leases.
--
-- Epochs: holds live in the buckets, and a bucket can be lost with its holds
-- (FLUSHALL, a restart without persistence, a failover to a replica that
-- missed the last writes) while instances go on spending what they held. The
-- epoch key, "<epoch>:<run_id>:<learning_until>", made by the first hold
-- ever granted on a server, names the server's current state of data: a
-- new epoch begins when the key is gone though the caller heard of it or a
-- store that was granted holds is watching the server (subscribed to the
-- channel of the key's name: the one way a caller that never heard of the
-- epoch learns that holds may exist), and, when a caller asks (a store's
-- first calls on a new connection), when the server that wrote it is not
-- this one (a restart or a failover: another run_id). Every reply ends with 2 x epoch + 1 (0 while there is no key),
-- which the caller sends back on its next call, and a store spends its
-- holds only while the epoch they were granted in is the current one,
-- confirmed by a reply to a call sent within the last second, and while
-- its watch is up (a broken watch or a message on it stops them at once). A loss makes
-- a stale holder stop spending within that second, but the new buckets
-- must not hand out the tokens it spends meanwhile: for LEARNING_US after a
-- new epoch ("learning"), every bucket read carries a hold of half its
-- capacity, standing in for the lost holds (the script keeps every
-- bucket's holds within half its capacity), debited whole at its end as
-- any expired hold is. No lease is granted meanwhile. A server where no
-- hold was ever granted has no key, and nothing to lose.
--
-- Reply, per decision: allowed (1/0), then per quota: remaining, wait_us,
-- reset_after_us, then, for a lease, the tokens granted (0: none) and its
-- flags: 1 if the hold it reports was there (the partial report's, if it
-- carries one; of the last quota), plus 2 if it got a hold of its
-- roomy size and lifetime (never for a lease sent again), and, for a report, 1 if the hold
-- was there (0: it expired, or was reported before); all integers up to 2^53 (waits and resets at most MAX_REPORTED), sent as one string of
-- little-endian doubles (struct.pack "<d" each; see the end), which loses
-- nothing; then, unless ARGV[1] is "", 2 x the epoch + 1, or 0 (see "Epochs").
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
-- Waits and resets are reported up to 2^53 microseconds (about 285 years):
-- past it a double is not exact (the sum is rounded, so a clamped sum is
-- exact), and src/store/bucket.rs reports the same bound.
local MAX_REPORTED = 9007199254740992

-- The most holds one bucket carries (leases of several instances, and an
-- instance's next lease asked for before its current one runs out).
local MAX_HOLDS = 16

-- A level (units) of a bucket kept under a quota whose full bucket is
-- `from` units, carried into one of `to` units (see "Changed quotas"): the
-- same share of the capacity, rounded down to a unit. Exact (floor of
-- level x n / d, n / d the ratio in lowest terms) while level x n is within
-- 2^52 of zero; else the double arithmetic less two units, more than its
-- rounding can add. As `Level::carried` in src/store/bucket.rs, number for
-- number.
local EXACT = 4503599627370496
local function carry(level, from, to)
  if from == to then
    return level
  end
  if level > from then
    level = from
  end
  local g, r = from, to
  while r > 0 do
    g, r = r, math.fmod(g, r)
  end
  local n, d = to / g, from / g
  local p = level * n
  local c
  if p <= EXACT and p >= -EXACT then
    c = floor(p / d)
    if c * d > p then
      c = c - 1
    end
  else
    c = floor(level * n / d) - 2
  end
  if c > to then
    c = to
  elseif c < -EXACT then
    c = -EXACT
  end
  return c
end

-- Integers (all below 2^53) are written with %d where a C long holds them
-- (every 64-bit build: exact, and much cheaper than %.0f), else with %.0f.
-- Lua 5.1's %d converts to a C long; struct's "l" is a C long too, and
-- asking its size costs far less than formatting a test number.
local INT, VALUE = "%.0f", "%.0f:%.0f"
if struct.size("l") >= 8 then
  INT, VALUE = "%d", "%d:%d"
end

-- How long a loss of data is covered by stand-in holds (see "Epochs"): twice
-- the second within which a store stops spending holds it cannot confirm.
local LEARNING_US = 2000000

-- The epoch (see "Epochs"): nil when the caller sent none.
local epoch, learning_until = nil, 0
local epoch_key, epoch_pending
local run_id
local function server_id()
  if not run_id then
    run_id = string.match(call("INFO", "server"), "run_id:(%w+)") or "?"
  end
  return run_id
end
local epoch_spec = ARGV[1] -- tollgate:epoch
if epoch_spec ~= "" then
  epoch_key = KEYS[#KEYS]
  local known, check = epoch_spec, false
  if sub(known, 1, 1) == "!" then
    known, check = sub(known, 2), true
  end
  known = tonumber(known) or 0
  local e, id, til
  local stored = call("GET", epoch_key)
  if stored then
    e, id, til = string.match(stored, "^(%d+):([^:]*):(%d+)$")
  end
  -- Whether holds may have been lost: the data is gone (the key with it)
  -- though the caller heard holds were granted, or a store that was granted
  -- holds is watching (subscribed to the channel named as the epoch key; a
  -- caller that heard nothing cannot tell a new server from a wiped one,
  -- the watchers can), or the server is another one (a restart or a
  -- failover). PUBLISH tells the watchers at once; it answers how many
  -- there are (an error, such as an ACL without the channel: none).
  local lost
  if not e then
    lost = known % 2 == 1
    local watchers = redis.pcall("PUBLISH", epoch_key, "lost")
    if type(watchers) == "number" and watchers > 0 then
      lost = true
    end
  else
    lost = check and id ~= server_id()
    if lost then
      redis.pcall("PUBLISH", epoch_key, "lost")
    end
  end
  if not e and not lost then
    -- No hold was ever granted here, as far as anyone can tell: nothing
    -- can be lost. The first grant makes the epoch (see the end).
    epoch_pending = true
    e, til = "0", "0"
  elseif lost then
    -- A new epoch, standing in for lost holds (learning).
    local fresh = now
    if e and fresh == e + 0 then
      fresh = fresh + 1
    end
    e, til = format(INT, fresh), format(INT, now + LEARNING_US)
    call("SET", epoch_key, e .. ":" .. server_id() .. ":" .. til)
  end
  epoch, learning_until = e + 0, til + 0
end

-- Whether this call granted a hold.
local granted_any = false

-- What the reply ends with (see "Epochs"): 2 x epoch + 1 while the server
-- has an epoch, 0 while it has none. The first grant makes one.
local function epoch_reply()
  if epoch_pending and granted_any then
    epoch, epoch_pending = now, false
    call("SET", epoch_key, format(INT, now) .. ":" .. server_id() .. ":0")
  end
  if epoch_pending then
    return 0
  end
  return 2 * epoch + 1
end
local learning = now < learning_until

local nq, width = ARGV[2] + 0, 3
if nq < 0 then
  -- Quotas with lock-outs: four numbers each.
  nq, width = -nq, 4
end
local a = 3 + width * nq
local nd = ARGV[a] + 0
a = a + 1

-- What a decision's figures go into (see the end), and the next key.
local reply, r, k = {}, 0, 1

-- Refilled from stamp up to now, for a bucket whose full is `full`
-- units, refilling `num` a microsecond: the level and the stamp. A clock
-- behind the stamp (failover) refills nothing and keeps it.
local function refilled(level, stamp, full, num)
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
  return level, stamp
end

-- The first decision left to the general steps (below the compact form):
-- none when every decision is a compact-form check of a bucket without
-- holds, the common case.
local rest = 1
if nd < 0 and not learning then
  -- The compact form: checks of quota 1, one key each, the common case under
  -- load. The steps of stored_bucket and finish, written out for one quota
  -- without debt (no per-quota lookups, one function call: the refill,
  -- shared with stored_bucket). Keep them in step with those two;
  -- tests/redis_store.rs (the_compact_form_decides_as_the_long_form) compares
  -- the two forms on random calls.
  local full, num, den = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
  -- A bucket is written with the quota's figures, "full,num" as they came.
  local figures_1 = ARGV[3] .. "," .. ARGV[4]
  local value_form = VALUE .. ":" .. figures_1
  -- Stored values and TTLs as text, by level (for buckets stamped now) and by
  -- TTL: under load most checks of a call leave their bucket at the same
  -- level with the same TTL, and formatting numbers is a large part of what
  -- a write costs. Only for calls of several checks (tables cost a call
  -- too).
  local at_now, ttls
  if nd < -1 then
    at_now, ttls = {}, {}
  end
  rest = 1 - nd
  for i = 1, -nd do
    -- Most costs are "1": compared, not converted.
    local cost = ARGV[a + i - 1]
    if cost == "1" then
      cost = 1
    else
      cost = cost + 0
    end
    local need = cost * den
    if need > full then
      return redis.error_reply("ERR tollgate: cost exceeds capacity")
    end
    local key = KEYS[i]
    -- stored_bucket
    local level, stamp, general = full, now, false
    local stored = call("GET", key) -- tollgate:compact-get
    if stored then
      local sep = find(stored, ":", 1, true)
      local sep2 = sep and find(stored, ":", sep + 1, true)
      local l, s
      if sep and (not sep2 or sub(stored, sep2 + 1) == figures_1) then
        l = tonumber(sub(stored, 1, sep - 1))
        s = tonumber(sub(stored, sep + 1, sep2 and sep2 - 1))
      end
      if l and s and l - l == 0 and s - s == 0 then
        level, stamp = refilled(l, s, full, num)
      elseif sep2 then
        general = true
      end
    end
    if general then
      -- A bucket with holds (leases), or kept under other figures (a
      -- changed quota): this check and the ones after it go to the general
      -- steps.
      rest = i
      break
    else
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
        if wait > MAX_REPORTED then
          wait = MAX_REPORTED
        end
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
        if at_now and stamp == now then
          value = at_now[level]
          if not value then
            value = format(value_form, level, stamp)
            at_now[level] = value
          end
        else
          value = format(value_form, level, stamp)
        end
        local px
        if ttls then
          px = ttls[ttl]
          if not px then
            px = format(INT, ttl + MARGIN_MS)
            ttls[ttl] = px
          end
        else
          px = format(INT, ttl + MARGIN_MS)
        end
        call("SET", key, value, "PX", px) -- tollgate:compact-set
      end
      if reset > 0 then
        reset = reset + ahead
        if reset > MAX_REPORTED then
          reset = MAX_REPORTED
        end
      end
      local remaining = 0
      if level > 0 then
        remaining = floor(level / den)
      end
      if nd == -1 then
        -- A call of one check (as the store sends a check alone): its
        -- reply without the table (see the end).
        if epoch then
          return struct.pack("<ddddd", allowed and 1 or 0, remaining, wait, reset, epoch_reply())
        end
        return struct.pack("<dddd", allowed and 1 or 0, remaining, wait, reset)
      end
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] =
        allowed and 1 or 0, remaining, wait, reset
      r = r + 4
    end
  end
end

if rest <= (nd < 0 and -nd or nd) then
  -- The general steps. A script's local functions and tables are made anew
  -- on every call (and each function's upvalues with it), so they are made
  -- here, only in a call that needs them.

  -- Numbers arrive as strings. Arithmetic converts one (`s + 0`) with a single
  -- strtod, where tonumber() runs two; most are "0" or "1" (one quota, cost 1,
  -- no debt), and those are looked up instead of converted.
  local known = { ["0"] = 0, ["1"] = 1 }

  -- Per quota: full (capacity x den), num, den, the lock-out (0: none),
  -- and "full,num" as written after a bucket's stamp (see "Changed quotas").
  local fulls, nums, dens, locks, figures = {}, {}, {}, {}, {}
  local b = 3
  for q = 1, nq do
    fulls[q], nums[q], dens[q] = ARGV[b] + 0, ARGV[b + 1] + 0, ARGV[b + 2] + 0
    figures[q] = ARGV[b] .. "," .. ARGV[b + 1]
    locks[q] = width == 4 and ARGV[b + 3] + 0 or 0
    b = b + width
  end

  -- The holds written after a bucket's stamp ("id,h,e;..."), as a list of
  -- {id, h, e}; entries that do not read are dropped.
  local function read_holds(text)
    local holds = {}
    for id, h, e in string.gmatch(text, "([^;,]+),(%d+),(%d+)") do
      holds[#holds + 1] = { id, h + 0, e + 0 }
    end
    return holds
  end

  -- The units of a bucket's level that its holds set aside.
  local function held_in(holds)
    local sum = 0
    if holds then
      for i = 1, #holds do
        sum = sum + holds[i][2]
      end
    end
    return sum
  end

  -- While learning (see "Epochs"), `holds` (nil: none) with the hold that
  -- stands in for those a loss of data took, half the capacity, until
  -- learning ends; the same hold for every read of the bucket in one epoch.
  local stand_in_id = epoch and ("~" .. format(INT, epoch))
  local function stand_in(holds, full)
    if not learning then
      return holds
    end
    holds = holds or {}
    for i = 1, #holds do
      if holds[i][1] == stand_in_id then
        return holds
      end
    end
    holds[#holds + 1] = { stand_in_id, floor(full / 2), learning_until }
    return holds
  end

  -- The bucket stored at key, for quota q, refilled up to now: level,
  -- stamp, whether it was stored (a missing or unreadable value is a full
  -- bucket), its holds (nil when it has none), every hold whose expiry has
  -- passed debited whole, and whether it was carried: kept under other
  -- figures of q's period (a changed quota, see "Changed quotas"), it is
  -- refilled under them, its holds debited whole, and carried into q's.
  local function stored_bucket(key, q)
    local full, num = fulls[q], nums[q]
    local stored = call("GET", key) -- tollgate:get
    if stored then
      local sep = find(stored, ":", 1, true)
      local level = sep and tonumber(sub(stored, 1, sep - 1))
      local sep2 = sep and find(stored, ":", sep + 1, true)
      local stamp = sep and tonumber(sub(stored, sep + 1, sep2 and sep2 - 1))
      local sep3 = sep2 and find(stored, ":", sep2 + 1, true)
      local kept = sep2 and sub(stored, sep2 + 1, sep3 and sep3 - 1)
      local kept_full, kept_num
      if kept and kept ~= figures[q] then
        local comma = find(kept, ",", 1, true)
        kept_full = comma and tonumber(sub(kept, 1, comma - 1))
        kept_num = comma and tonumber(sub(kept, comma + 1))
        if not (kept_full and kept_num and kept_full - kept_full == 0
            and kept_num - kept_num == 0 and kept_full > 0 and kept_num > 0) then
          level = nil
        end
      end
      -- tonumber also reads "nan" and "inf": x - x is 0 only for a finite x.
      if level and stamp and level - level == 0 and stamp - stamp == 0 then
        local holds
        if sep3 then
          holds = read_holds(sub(stored, sep3 + 1))
        end
        if kept_full then
          level, stamp = refilled(level, stamp, kept_full, kept_num)
          level = carry(level - held_in(holds), kept_full, full)
          holds = nil
        end
        level, stamp = refilled(level, stamp, full, num)
        if holds then
          local live = {}
          for _, hold in ipairs(holds) do
            if hold[3] <= now then
              level = level - hold[2]
            else
              live[#live + 1] = hold
            end
          end
          holds = live
          if #holds == 0 then
            holds = nil
          end
        end
        return level, stamp, true, stand_in(holds, full), kept_full ~= nil, kept_full, kept_num, kept
      end
    end
    return full, now, false, stand_in(nil, full), false
  end

  -- Stores a bucket's value for ttl milliseconds and the margin.
  local function put(key, value, ttl)
    call("SET", key, value, "PX", format(INT, ttl + MARGIN_MS)) -- tollgate:set
  end

  -- Writes a bucket under figures other than a quota's: `full` and `num`,
  -- `figures` their text (see `adjust`), with the stand-in hold while
  -- learning (see "Epochs"), as `finish` writes holds.
  local function write_under(key, level, stamp, full, num, figures)
    local holds = stand_in(nil, full)
    local missing = full - level + held_in(holds)
    local reset = floor(missing / num)
    if reset * num < missing then
      reset = reset + 1
    end
    local ms = reset + (stamp - now)
    local value = format(VALUE, level, stamp) .. ":" .. figures
    if holds then
      local hold = holds[1]
      value = value .. ":" .. hold[1] .. "," .. format(INT, hold[2]) .. "," .. format(INT, hold[3])
      ms = ms + (hold[3] - now)
    end
    local ttl = floor(ms / 1000)
    if ttl * 1000 < ms then
      ttl = ttl + 1
    end
    put(key, value, ttl)
  end

  -- The debt a reservation may take on in a bucket of quota q stamped at
  -- `stamp`: a clock behind the stamp (failover) makes every wait start from
  -- the stamp, so the time ahead comes off the debt, and the wait stays
  -- within max_wait. For a quota with a lock-out, whose stamp ahead may be a
  -- lock-out's end, nothing is admitted before the stamp: only a reservation
  -- that may wait that long and more (else no level is enough).
  local function debt_at(q, debt, stamp)
    if stamp > now then
      local ahead = (stamp - now) * nums[q]
      if locks[q] > 0 then
        if ahead > debt then
          return -math.huge
        end
        return debt - ahead
      end
      if debt > 0 then
        if ahead >= debt then
          return 0
        end
        return debt - ahead
      end
    end
    return debt
  end

  -- A refused decision's bucket of quota q, locked out if it refuses the
  -- cost (need units, with debt) itself (see "Lock-outs"): the level, the
  -- stamp and whether it was locked out.
  local function lock_out(q, level, stamp, holds, need, debt)
    local lock = locks[q]
    -- Not while learning: a refusal then may be the stand-in hold's.
    if lock > 0 and need > 0 and stamp <= now and not learning then
      local held = held_in(holds)
      local free = level - held
      if free - need < -debt and need - free <= lock * nums[q] then
        level = need + held
        if level > fulls[q] then
          level = fulls[q]
        end
        return level, now + lock, true
      end
    end
    return level, stamp, false
  end

  -- Spends from one bucket of a decision (if it is admitted), writes it back
  -- with its TTL (if `write`), and appends its figures to the
  -- reply: remaining, wait_us, reset_after_us. Its holds (nil: none) are
  -- written after its stamp, and only what they leave counts as remaining.
  local function finish(key, q, level, stamp, need, allowed, write, holds)
    local full, num, den = fulls[q], nums[q], dens[q]
    -- A clock behind the stamp refills nothing until it reaches the stamp, so
    -- waits start from the stamp.
    local ahead = stamp - now
    -- A lock-out quota's bucket stamped ahead holds nothing until the stamp.
    local waits = ahead > 0 and locks[q] > 0
    local wait = 0
    if allowed then
      level = level - need
    end
    local free = level - held_in(holds)
    if allowed then
      if free < 0 or waits then
        local t = 0
        if free < 0 then
          t = floor(-free / num)
          if t * num < -free then
            t = t + 1
          end
        end
        wait = ahead + t
        if wait > MAX_REPORTED then
          wait = MAX_REPORTED
        end
      end
    elseif free < need or waits then
      local x = need - free
      local t = 0
      if x > 0 then
        t = floor(x / num)
        if t * num < x then
          t = t + 1
        end
      end
      wait = ahead + t
      if wait > MAX_REPORTED then
        wait = MAX_REPORTED
      end
    end
    -- ceil((full - free) / num): when the bucket is full again, counted from
    -- the stamp (with holds: once they are debited whole, from the last
    -- expiry); the key lives that long plus MARGIN_MS.
    local missing = full - free
    local reset = floor(missing / num)
    if reset * num < missing then
      reset = reset + 1
    end
    if write then
      local ms = reset + ahead
      local value = format(VALUE, level, stamp) .. ":" .. figures[q]
      if holds then
        local last, parts = now, {}
        for i = 1, #holds do
          local hold = holds[i]
          parts[i] = hold[1] .. "," .. format(INT, hold[2]) .. "," .. format(INT, hold[3])
          if hold[3] > last then
            last = hold[3]
          end
        end
        value = value .. ":" .. table.concat(parts, ";")
        ms = ms + (last - now)
      end
      local ttl = floor(ms / 1000)
      if ttl * 1000 < ms then
        ttl = ttl + 1
      end
      put(key, value, ttl)
    end
    if reset > 0 or waits then
      reset = reset + ahead
      if reset > MAX_REPORTED then
        reset = MAX_REPORTED
      end
    end
    local remaining = 0
    if free > 0 and not waits then
      remaining = floor(free / den)
    end
    reply[r + 1], reply[r + 2], reply[r + 3] = remaining, wait, reset
    r = r + 3
  end

  -- An adjustment after the fact (debt -1), decided by a response: cost
  -- tokens spent from the bucket (a charge) or, when cost is negative, given
  -- back to it (a refund), whatever its level. A refund fills the bucket up to
  -- full at most, so it never admits more than if the refunded request had
  -- never come; a charge takes what is not held into debt down to -full at
  -- most (one bucket's worth, the most one request may cost), which the next
  -- admission waits to see refilled; held tokens stay for their holders'
  -- reports to debit. The clamps never move the level against the
  -- adjustment: a bucket deeper in debt than -full (reservations) keeps its
  -- debt through a charge, and a refund never lowers one above full. Always
  -- applied; the reply is that of an admitted check of nothing. A bucket
  -- not stored that ends full is not written: it stays as it was. A bucket
  -- kept under other figures (the adjustment's policy changed since its
  -- request was decided, see "Changed quotas") is adjusted in the
  -- adjustment's figures, then carried back and written under its own: a
  -- stale policy's rate never comes back.
  local function adjust(key, q, cost)
    local full, num, den = fulls[q], nums[q], dens[q]
    local level, stamp, stored, holds, carried, kept_full, kept_num, kept = stored_bucket(key, q)
    -- Exact wherever the clamps do not apply: both operands are below 2^53.
    local moved = level - cost * den
    if cost > 0 then
      -- What is not held may go down to -full: held tokens are debited when
      -- their holders report what they spent, and must find them there.
      local lowest = -full + held_in(holds)
      if moved < lowest then
        moved = lowest
      end
      if moved > level then
        moved = level
      end
    else
      if moved > full then
        moved = full
      end
      if moved < level then
        moved = level
      end
    end
    level = moved
    if carried then
      finish(key, q, level, stamp, 0, true, false, holds)
      write_under(key, carry(level, full, kept_full), stamp, kept_full, kept_num, kept)
    else
      finish(key, q, level, stamp, 0, true, stored or level < full, holds)
    end
  end

  -- The hold of `holds` (nil: none) whose id is `id`, and its place.
  local function hold_of(holds, id)
    if holds then
      for i = 1, #holds do
        if holds[i][1] == id then
          return holds[i], i
        end
      end
    end
    return nil
  end

  -- A report of hold `id`, which spent `spent` units: debits them (never more
  -- than the hold) and releases the hold; with `spent` negative, a partial
  -- report of -spent units, which debits them and keeps the rest held.
  -- Returns the level, the holds (nil when none are left) and whether the
  -- hold was there.
  local function release(level, holds, id, spent)
    local hold, at = hold_of(holds, id)
    if not hold then
      return level, holds, false
    end
    local partial = spent < 0
    if partial then
      spent = -spent
    end
    if spent > hold[2] then
      spent = hold[2]
    end
    if partial and spent < hold[2] then
      hold[2] = hold[2] - spent
      return level - spent, holds, true
    end
    table.remove(holds, at)
    if #holds == 0 then
      holds = nil
    end
    return level - spent, holds, true
  end

  if nd < 0 then
    -- The compact form's checks from the first bucket with holds on
    -- (leases): the general steps of the same checks.
    for i = rest, -nd do
      local cost = known[ARGV[a + i - 1]] or ARGV[a + i - 1] + 0
      local full, need = fulls[1], cost * dens[1]
      if need > full then
        return redis.error_reply("ERR tollgate: cost exceeds capacity")
      end
      local key = KEYS[i]
      local level, stamp, _, holds, carried = stored_bucket(key, 1)
      local allowed = level - held_in(holds) >= need
      r = r + 1
      reply[r] = allowed and 1 or 0
      finish(key, 1, level, stamp, need, allowed, (allowed or carried) and cost > 0, holds)
    end
  else
    -- A decision over one quota (the common case) is decided at once; one over
    -- several reads all its buckets first, since it is admitted only if every
    -- bucket holds the cost. Per quota of such a decision: index, level, stamp.
    local qs, lv, st, hs, ds = {}, {}, {}, {}, {}
    for _ = 1, nd do
      local n, cost = known[ARGV[a]] or ARGV[a] + 0, known[ARGV[a + 1]] or ARGV[a + 1] + 0
      local marker = known[ARGV[a + 3]] or ARGV[a + 3] + 0
      if n == 1 and marker >= 0 then
        local q, debt = known[ARGV[a + 2]] or ARGV[a + 2] + 0, marker
        a = a + 4
        local full, need = fulls[q], cost * dens[q]
        if need > full then
          return redis.error_reply("ERR tollgate: cost exceeds capacity")
        end
        local key = KEYS[k]
        local level, stamp, _, holds, carried = stored_bucket(key, q)
        local allowed = level - held_in(holds) - need >= -debt_at(q, debt, stamp)
        -- A bucket carried into changed figures is written under them by
        -- its first check, refused or not (see "Changed quotas").
        local write = (allowed or carried) and cost > 0
        if not allowed then
          local locked
          level, stamp, locked = lock_out(q, level, stamp, holds, need, debt)
          write = write or locked
        end
        r = r + 1
        reply[r] = allowed and 1 or 0
        finish(key, q, level, stamp, need, allowed, write, holds)
        k = k + 1
      elseif marker == -1 then
        -- An adjustment: each bucket on its own.
        a = a + 2
        r = r + 1
        reply[r] = 1
        for i = 1, n do
          adjust(KEYS[k + i - 1], known[ARGV[a]] or ARGV[a] + 0, cost)
          a = a + 2
        end
        k = k + n
      elseif marker == -2 then
        -- A lease: a check of cost and, if admitted, a hold on every bucket.
        a = a + 2
        local id, want, life = ARGV[a + 2 * n], ARGV[a + 2 * n + 1] + 0, ARGV[a + 2 * n + 2] + 0
        local rid, rspent = ARGV[a + 2 * n + 3], ARGV[a + 2 * n + 4] + 0
        local rwant, rlife = ARGV[a + 2 * n + 5] + 0, ARGV[a + 2 * n + 6] + 0
        local pid, pspent = ARGV[a + 2 * n + 7], ARGV[a + 2 * n + 8] + 0
        -- found: the partial report found its hold on the last quota's bucket
        -- (the first report's, without one); released_any: either released
        -- something (the buckets change).
        local allowed, grant, again, found, released_any = true, nil, nil, 0, false
        local carried_any = false
        local roomy = rwant > 0
        for i = 1, n do
          local q = known[ARGV[a]] or ARGV[a] + 0
          a = a + 2
          local full, num, den = fulls[q], nums[q], dens[q]
          local need = cost * den
          if need > full then
            return redis.error_reply("ERR tollgate: cost exceeds capacity")
          end
          local level, stamp, _, holds, carried = stored_bucket(KEYS[k + i - 1], q)
          carried_any = carried_any or carried
          -- The reports it carries (rid, pid "0": none), unless the lease
          -- ran before and was granted a hold. (A lease sent again after a
          -- first run that granted nothing debits its partial report twice:
          -- too much is debited, never too little.)
          local hold = hold_of(holds, id)
          if hold then
            again = hold[2] / den
          else
            local released
            level, holds, released = release(level, holds, rid, rspent * den)
            if released then
              found, released_any = 1, true
            end
            if pid ~= "0" then
              level, holds, released = release(level, holds, pid, pspent * den)
              found = released and 1 or 0
              released_any = released_any or released
            end
          end
          qs[i], lv[i], st[i], hs[i] = q, level, stamp, holds
          local free = level - held_in(holds) - need
          if free < 0 then
            allowed = false
          end
          if 4 * free < 3 * full then
            roomy = false
          end
          -- At most half of what the cost leaves, in whole tokens, and no
          -- more than half the room left under the holds' cap of half the
          -- capacity (what a loss of data stands in for, see "Epochs"): a
          -- holder that asks first leaves room for the others sharing the
          -- key, so holders' shares even out.
          local share = 0
          if free > 0 and (holds == nil or #holds < MAX_HOLDS) then
            share = floor(free / (2 * den))
            local room = floor((floor(full / 2) - held_in(holds)) / 2)
            if room < share * den then
              share = room > 0 and floor(room / den) or 0
            end
          end
          if grant == nil or share < grant then
            grant = share
          end
        end
        if roomy then
          want, life = rwant, rlife
        end
        if want < grant then
          grant = want
        end
        a = a + 9
        r = r + 1
        if again then
          -- Resent: it was admitted and granted; answered as it was, with
          -- nothing spent again.
          reply[r] = 1
          for i = 1, n do
            finish(KEYS[k + i - 1], qs[i], lv[i], st[i], 0, true, released_any or carried_any, hs[i])
          end
          grant, roomy = again, false
        else
          reply[r] = allowed and 1 or 0
          if not allowed or grant < 1 then
            grant = 0
          end
          for i = 1, n do
            local q = qs[i]
            local holds = hs[i]
            if grant > 0 then
              holds = holds or {}
              holds[#holds + 1] = { id, grant * dens[q], now + life }
            end
            local write = (allowed and (cost > 0 or grant > 0)) or released_any or carried_any
            finish(KEYS[k + i - 1], q, lv[i], st[i], cost * dens[q], allowed, write, holds)
          end
        end
        if grant > 0 then
          granted_any = true
        end
        reply[r + 1], reply[r + 2] = grant, found + ((roomy and grant > 0) and 2 or 0)
        r = r + 2
        k = k + n
      elseif marker == -3 then
        -- A lease's report: cost is what the hold's holder spent of it.
        a = a + 2
        local id = ARGV[a + 2 * n]
        local found = 0
        r = r + 1
        reply[r] = 1
        for i = 1, n do
          local q = known[ARGV[a]] or ARGV[a] + 0
          a = a + 2
          local full, den = fulls[q], dens[q]
          local key = KEYS[k + i - 1]
          -- A bucket carried from other figures has no holds of these
          -- (debited whole): nothing to release, and it is not written back
          -- under the figures of a report that may be stale (a lease of a
          -- policy since changed).
          local level, stamp, _, holds = stored_bucket(key, q)
          local released
          level, holds, released = release(level, holds, id, cost * den)
          if released then
            found = 1
          end
          finish(key, q, level, stamp, 0, true, released, holds)
        end
        a = a + 1
        r = r + 1
        reply[r] = found
        k = k + n
      else
        a = a + 2
        local allowed, carried_any = true, false
        for i = 1, n do
          local q, debt = known[ARGV[a]] or ARGV[a] + 0, known[ARGV[a + 1]] or ARGV[a + 1] + 0
          a = a + 2
          local full, need = fulls[q], cost * dens[q]
          if need > full then
            return redis.error_reply("ERR tollgate: cost exceeds capacity")
          end
          local level, stamp, _, holds, carried = stored_bucket(KEYS[k + i - 1], q)
          carried_any = carried_any or carried
          qs[i], lv[i], st[i], hs[i], ds[i] = q, level, stamp, holds, debt
          if level - held_in(holds) - need < -debt_at(q, debt, stamp) then
            allowed = false
          end
        end
        r = r + 1
        reply[r] = allowed and 1 or 0
        -- A refusal that locks a bucket out writes them all, each brought up
        -- to now (as src/store/memory.rs stores a client's buckets together),
        -- and so does a check that carried one into changed figures.
        local write = (allowed or carried_any) and cost > 0
        if not allowed then
          for i = 1, n do
            local q, locked = qs[i], false
            lv[i], st[i], locked = lock_out(q, lv[i], st[i], hs[i], cost * dens[q], ds[i])
            write = write or locked
          end
        end
        for i = 1, n do
          local q = qs[i]
          finish(KEYS[k + i - 1], q, lv[i], st[i], cost * dens[q], allowed, write, hs[i])
        end
        k = k + n
      end
    end
  end
end

-- The reply goes back as one string of little-endian doubles (exact: every
-- number is an integer below 2^53): one bulk string costs the client one
-- read, where a list of integers costs it a parse per number, and it costs
-- Redis less to send than a table. unpack() puts each value on Lua's stack,
-- so a long reply is packed in chunks.
if epoch then
  r = r + 1
  reply[r] = epoch_reply()
elseif r == 4 then
  -- One check of one quota (the usual call when checks are not batched).
  return struct.pack("<dddd", reply[1], reply[2], reply[3], reply[4])
end
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
