-- idem_helpers.lua: what the idempotency store's specs share: fresh keys, keyed POSTs, the repeat that waits out
-- a key still in flight, and the problem type of the store's own answers.
local H = require("helpers")

local I = {}

-- A key no earlier run or spec used: tag, the time and a count.
local key_n = 0
function I.new_key(tag)
    key_n = key_n + 1
    return ("%s-%d-%d"):format(tag or "key", os.time(), key_n)
end

-- A keyed POST (no key when key is nil), JSON by default; extra: more { name, value } fields.
function I.post(port, path, key, body, extra)
    local headers = { { "Content-Type", "application/json" } }
    if key then headers[#headers + 1] = { "Idempotency-Key", key } end
    for _, h in ipairs(extra or {}) do headers[#headers + 1] = h end
    return H.request(port, { method = "POST", path = path, headers = headers, body = body or '{"amount":10}' })
end

-- A repeat of a request that has just been answered. The answer reaches the client a moment before the
-- gateway's store has it (the store is written as the request ends), so a repeat sent at once may still
-- find the key in flight: 409 with Retry-After, as a client would be told. It retries that, briefly.
function I.repeat_post(port, path, key, body, extra)
    local last
    H.wait_until(function()
        last = I.post(port, path, key, body, extra)
        return not (last and last.status == 409 and last.body:find("idempotency-key-in-use", 1, true))
    end, 15) -- the store's write waits its turn on a busy machine
    return last
end

-- The RFC 9457 type of a store's own answer, or nil.
function I.problem_type(resp)
    local ok, doc = pcall(H.json.decode, resp and resp.body or "")
    return ok and type(doc) == "table" and doc.type or nil
end

return I
