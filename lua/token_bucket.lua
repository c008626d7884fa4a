-- tollgate: an exact token bucket for one client, over one or more quotas at once.
-- The same algorithm as src/store/bucket.rs; keep the two in step.
--
-- KEYS[i]    one key per quota, all with the client's {hash tag} (one cluster slot)
-- ARGV[1]    cost: tokens to spend from every bucket (0 = peek, writes nothing)
-- ARGV[2]    reserved, "" (this script always takes the clock from Redis TIME;
--            only the variant the `test-util` cargo feature builds for tests,
--            a different script with its own SHA, reads a clock from here).
-- ARGV[3i..] per quota: capacity, num, den. The refill is num/den tokens per
--            microsecond; levels are kept in units of 1/den token, so every refill
--            is an exact integer. Quota checks keep capacity*den and num <= 2^52,
--            so every number below stays under 2^53, exact in Lua's doubles.
--
-- Stored value: "<level>:<stamp>" (decimal integers), with a TTL equal to the time
-- to refill completely plus a margin, so an idle client's key disappears exactly
-- when forgetting it changes nothing.
--
-- Reply: { allowed (1/0), then per quota: remaining, retry_after_us, reset_after_us }
-- all integers, so Redis's number conversion loses nothing.

-- Effects replication: a script that reads TIME must replicate its writes, not
-- itself (the default since Redis 5; harmless where it is already on).
if redis.replicate_commands then
  redis.replicate_commands()
end

local TTL_MARGIN_MS = 1000

local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local cost = tonumber(ARGV[1])
local now = redis.call("TIME") -- tollgate:clock
now = tonumber(now[1]) * 1000000 + tonumber(now[2])

local n = #KEYS
local levels, stamps, fulls, nums, dens = {}, {}, {}, {}, {}
local allowed = 1

for i = 1, n do
  local base = 3 * i
  local capacity = tonumber(ARGV[base])
  local num = tonumber(ARGV[base + 1])
  local den = tonumber(ARGV[base + 2])
  local full = capacity * den
  if cost > capacity then
    return redis.error_reply("ERR tollgate: cost exceeds capacity")
  end

  local level, stamp = full, now
  local stored = redis.call("GET", KEYS[i])
  if stored then
    local sep = string.find(stored, ":", 1, true)
    local l = sep and tonumber(string.sub(stored, 1, sep - 1))
    local s = sep and tonumber(string.sub(stored, sep + 1))
    if l and s then
      level = math.min(l, full)
      stamp = s
      if now > stamp then
        local elapsed = now - stamp
        -- Compare before multiplying so the product stays below 2^53.
        if elapsed >= ceil_div(full - level, num) then
          level = full
        else
          level = level + elapsed * num
        end
        stamp = now
      end
      -- A clock behind the stamp (failover) refills nothing and keeps the stamp.
    end
  end

  if level < cost * den then
    allowed = 0
  end
  levels[i], stamps[i], fulls[i], nums[i], dens[i] = level, stamp, full, num, den
end

local reply = { allowed }
for i = 1, n do
  local need = cost * dens[i]
  -- A clock behind the stamp refills nothing until it reaches the stamp, so
  -- waits start from the stamp.
  local ahead = stamps[i] - now
  local retry = 0
  if allowed == 0 and levels[i] < need then
    retry = ahead + ceil_div(need - levels[i], nums[i])
  end
  if allowed == 1 and cost > 0 then
    levels[i] = levels[i] - need
    local to_full = ceil_div(fulls[i] - levels[i], nums[i])
    local ttl = ceil_div(to_full + (stamps[i] - now), 1000) + TTL_MARGIN_MS
    redis.call("SET", KEYS[i], string.format("%.0f:%.0f", levels[i], stamps[i]), "PX", ttl)
  end
  local reset = ceil_div(fulls[i] - levels[i], nums[i])
  if reset > 0 then
    reset = reset + ahead
  end
  reply[#reply + 1] = math.floor(levels[i] / dens[i])
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
