-- tollgate, Redis Cluster: a batch of decisions whose clients live in several
-- slots of one node. Put in front of token_bucket.lua, whose body runs
-- unchanged after it (one script, its own SHA: src/store/redis/script.rs).
--
-- KEYS        the first decision's keys only: what routes the call to the
--             primary of that client's slot.
-- ARGV        the arguments of token_bucket.lua, then every key of the batch
--             in the order token_bucket.lua reads KEYS, then their number.
--
-- A script without a shebang line may touch keys it did not declare, in any
-- slot, as long as this node serves them (Redis 7 sets SCRIPT_ALLOW_CROSS_SLOT
-- for such scripts; 6.2 checks only that a key is local); a key of another
-- node fails its command with "... non local key ...". So every key is read
-- first, before anything is written: if one is not served here, the call
-- writes nothing and replies {-1}, and the client sends the batch's
-- decisions one by one, each routed to its own slot's primary.
--
-- The values read are kept and the body's GET reads them from here; its SET
-- updates them, so a key that comes twice in the batch is read as the
-- decision before left it, exactly as the same decisions sent one by one.

local KEYS, redis = KEYS, redis
do
  local real = redis
  local argc = #ARGV
  local n = ARGV[argc] + 0
  local keys, held = {}, {}
  for i = 1, n do
    local key = ARGV[argc - n + i - 1]
    keys[i] = key
    if held[key] == nil then
      local value = real.pcall("GET", key)
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
  redis = setmetatable({
    call = function(command, ...)
      if command == "GET" then
        local value = held[(...)]
        if value ~= nil then
          return value
        end
      elseif command == "SET" then
        local key, value = ...
        held[key] = value
      end
      return real.call(command, ...)
    end,
  }, { __index = real })
end

