-- tollgate, Redis Cluster: a batch of decisions whose clients live in several
-- slots of one node. Put in front of token_bucket.lua, whose body runs after
-- it with its bucket GET and SET lines rewritten to go through `held` (one
-- script, its own SHA: src/store/redis/script.rs, `Script::spread`).
--
-- KEYS        the batch's keys in the slot of its first key (the store sends
--             other clients of that slot apart, so these are one client's):
--             they route the call to that slot's primary, and while that
--             slot migrates Redis serves them together or not at all. No
--             other key of that slot may be undeclared: after ASK, the
--             slot's new primary would read it as missing (ASKING) while it
--             still lives on the old one.
-- ARGV        the arguments of token_bucket.lua, then every key of the batch
--             (declared or not) in the order token_bucket.lua reads KEYS,
--             then their number.
--
-- A script without a shebang line may touch keys it did not declare, in any
-- slot, as long as this node serves them (Redis 7 sets SCRIPT_ALLOW_CROSS_SLOT
-- for such scripts; 6.2 checks only that a key is local); a key of another
-- node fails its command with "... non local key ...". So every key is read
-- first, before anything is written: if one is not served here, the call
-- writes nothing and replies {-1}, and the client sends the batch's
-- decisions one by one, each routed to its own slot's primary.
--
-- Left open: a call sent on with ASK runs with ASKING for every slot its
-- node imports, so a key of a second slot being imported into the same node
-- at that moment, not yet moved, would read as missing. redis-cli moves one
-- slot at a time, so this needs two slots moved into one node in parallel.
--
-- The clock is read first, before any key: the body's own TIME line is
-- taken out (src/store/redis/script.rs, `Script::spread`) and it stamps
-- buckets with this `now`, so the key-expiry argument of token_bucket.lua
-- (a key lasts until its bucket is full, with MARGIN_MS to spare) holds
-- here as it does for the body alone, whatever the prologue costs: with
-- TIME read after thousands of GETs (1024 checks over several quotas), a
-- server whose TIME moves during a call but whose PX counts from the call's
-- start would expire keys that long, less the margin, before their buckets
-- are full, and a later call would read them full. Redis itself does not:
-- 7.0 counts PX from when SET runs (after TIME) and judges expiry by the
-- call's start; 7.2 and later freeze TIME, PX and expiry at the call's
-- start. Either way the order changes nothing there.
--
-- The values read are kept in `held`, and the body reads them from there
-- instead of sending GET again: its GET and SET lines are rewritten for this
-- script (src/store/redis/script.rs, `Script::spread`) to read `held` and to
-- keep it up to date, so a key that comes twice in the batch is read as the
-- decision before left it, exactly as the same decisions sent one by one.

-- Effects replication, as in the body: TIME comes before any write.
if redis.replicate_commands then
  redis.replicate_commands()
end

local now = redis.call("TIME") -- tollgate:clock

local KEYS, held = KEYS, {}
do
  local argc = #ARGV
  local n = ARGV[argc] + 0
  local keys = {}
  for i = 1, n do
    local key = ARGV[argc - n + i - 1]
    keys[i] = key
    if held[key] == nil then
      local value = redis.pcall("GET", key)
      if type(value) == "table" then
        if value.err and string.find(value.err, "non local key", 1, true) then
          return { -1 }
        end
        return value
      end
      held[key] = value
    end
  end
  KEYS = keys
end
