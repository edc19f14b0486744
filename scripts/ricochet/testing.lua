-- ricochet/testing.lua: the offline test kit for route scripts (busted --lua=luajit, or any LuaJIT code).
--
--   local kit = require("ricochet.testing")
--   local route = kit.load("scripts/payments.lua")      -- the gateway's sandbox, the same checks
--   local req = kit.request{ method = "POST", path = "/pay", headers = { ["Content-Type"] = "application/json" },
--                            body = '{"order_id":"A-17"}' }
--   route.on_request(req)
--   assert.equal("order-A-17", req:idempotency_key())
--   local res = kit.response{ status = 409 }
--   assert.equal("accept", route.classify(res, kit.attempt{ number = 1 }))
--
-- req, res and attempt are built by ricochet/api.lua, the file the gateway runs, over a binding written in
-- Lua instead of C; kit.upstream(req) and kit.answer(req) tell what on_request did.
local sandbox = require("ricochet.sandbox")
local make_api = require("ricochet.api")
local bit = require("bit")

local kit = { logs = {}, shared = {} }

-- SHA-256 and HMAC-SHA-256 in Lua (FIPS 180-4, RFC 2104), hex like the gateway's OpenSSL ones --------------
local band, bor, bxor, bnot, rshift, lshift, ror, tobit =
    bit.band, bit.bor, bit.bxor, bit.bnot, bit.rshift, bit.lshift, bit.ror, bit.tobit
local K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local function sha256_raw(msg)
    local len = #msg
    msg = msg .. "\128" .. ("\0"):rep((55 - len) % 64)
    local bits = len * 8
    for i = 7, 0, -1 do msg = msg .. string.char(math.floor(bits / 2 ^ (8 * i)) % 256) end
    local h = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 }
    local w = {}
    for chunk = 1, #msg, 64 do
        for i = 0, 15 do
            local a, b, c, d = msg:byte(chunk + 4 * i, chunk + 4 * i + 3)
            w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
        end
        for i = 16, 63 do
            local s0 = bxor(ror(w[i - 15], 7), ror(w[i - 15], 18), rshift(w[i - 15], 3))
            local s1 = bxor(ror(w[i - 2], 17), ror(w[i - 2], 19), rshift(w[i - 2], 10))
            w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
        end
        local a, b, c, d, e, f, g, hh = h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
        for i = 0, 63 do
            local S1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
            local ch = bxor(band(e, f), band(bnot(e), g))
            local t1 = tobit(hh + S1 + ch + K[i + 1] + w[i])
            local S0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
            local maj = bxor(band(a, b), band(a, c), band(b, c))
            local t2 = tobit(S0 + maj)
            hh, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
        end
        h[1], h[2], h[3], h[4] = tobit(h[1] + a), tobit(h[2] + b), tobit(h[3] + c), tobit(h[4] + d)
        h[5], h[6], h[7], h[8] = tobit(h[5] + e), tobit(h[6] + f), tobit(h[7] + g), tobit(h[8] + hh)
    end
    local out = {}
    for i = 1, 8 do
        local v = h[i]
        out[i] = string.char(band(rshift(v, 24), 255), band(rshift(v, 16), 255), band(rshift(v, 8), 255), band(v, 255))
    end
    return table.concat(out)
end

local function hex(s)
    return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

function kit.sha256(s) return hex(sha256_raw(s)) end

function kit.hmac_sha256(key, s)
    if #key > 64 then key = sha256_raw(key) end
    key = key .. ("\0"):rep(64 - #key)
    local ipad = key:gsub(".", function(c) return string.char(bxor(c:byte(), 0x36)) end)
    local opad = key:gsub(".", function(c) return string.char(bxor(c:byte(), 0x5c)) end)
    return hex(sha256_raw(opad .. sha256_raw(ipad .. s)))
end

-- A message as the gateway's error log writes it (core/log.c): \n \r \t as those two characters, other
-- control bytes, DEL and backslash as \xNN, so that nothing in it can start a line of its own.
local ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
for byte = 0, 127 do
    local c = string.char(byte)
    if not ESCAPES[c] and (byte < 32 or byte == 127 or c == "\\") then ESCAPES[c] = ("\\x%02x"):format(byte) end
end

function kit.as_logged(s)
    local out, from = {}, 1
    while true do
        local at = s:find("[%z\1-\31\127\\]", from)
        if not at then break end
        out[#out + 1] = s:sub(from, at - 1)
        out[#out + 1] = ESCAPES[s:sub(at, at)]
        from = at + 1
    end
    out[#out + 1] = s:sub(from)
    return table.concat(out)
end

-- the pure-Lua binding --------------------------------------------------------------------------------------
local RESERVED = { ["content-length"] = true, ["transfer-encoding"] = true, connection = true,
    ["keep-alive"] = true, upgrade = true, te = true, trailer = true, ["proxy-connection"] = true }

local function lower_map(t)
    local m = {}
    for k, v in pairs(t or {}) do m[k:lower()] = tostring(v) end
    return m
end

local random_seeded = false
local function uuid()
    if not random_seeded then math.randomseed(os.time()); random_seeded = true end
    local t = {}
    for i = 1, 16 do t[i] = math.random(0, 255) end
    t[7] = bor(band(t[7], 0x0f), 0x40)
    t[9] = bor(band(t[9], 0x3f), 0x80)
    local h = {}
    for i = 1, 16 do h[i] = ("%02x"):format(t[i]) end
    local s = table.concat(h)
    return s:sub(1, 8) .. "-" .. s:sub(9, 12) .. "-" .. s:sub(13, 16) .. "-" .. s:sub(17, 20) .. "-" .. s:sub(21)
end

-- cjson as the gateway's JSON module has it (core/script_json.c): lua-cjson 2.1.0's texts and errors, and
-- the gateway's refusals, so a script sees offline what it sees live: nesting deeper than 1000 cannot be set,
-- a setting's integer is checked before lua-cjson casts it, and an array longer than 2^24 (its largest
-- index, when the sparse settings make it an array) is refused before lua-cjson writes its nulls (or loops
-- on an index near 2^31). The kit bounds neither time nor memory: what the gateway stops, lua-cjson runs.
local JSON_MAX_DEPTH, JSON_ARRAY_MAX, INT_MAX = 1000, 16777216, 2147483647

-- an array's refusal in v (a table at depth), as the gateway's encoder meets them, or nil
local function long_array(v, depth, cfg)
    if type(v) ~= "table" or depth > cfg.depth then return nil end -- lua-cjson refuses the nesting itself
    local max, items, array = 0, 0, true
    for k in pairs(v) do
        if type(k) == "number" and k >= 1 and k == math.floor(k) and k <= INT_MAX then
            if k > max then max = k end
            items = items + 1
        else
            array = false
            break
        end
    end
    local sparse = cfg.ratio > 0 and max > items * cfg.ratio and max > cfg.safe
    if array and not sparse and max > JSON_ARRAY_MAX then
        return ("Cannot serialise table: array index %.14g is over %d"):format(max, JSON_ARRAY_MAX)
    end
    for _, x in pairs(v) do
        local why = long_array(x, depth + 1, cfg)
        if why then return why end
    end
end

local function json_module(real, safe)
    local function int_arg(name, v, min, max)
        if type(v) == "number" and (v < min or v > max) then
            error(("bad argument #1 to '%s' (expected integer between %d and %d)"):format(name, min, max), 0)
        end
    end
    local M = {}
    function M.new()
        local inst, cfg = real.new(), { depth = JSON_MAX_DEPTH, ratio = 2, safe = 10 }
        local m = {}
        for k, v in pairs(inst) do m[k] = v end
        m.new = M.new
        function m.encode_max_depth(...)
            int_arg("encode_max_depth", (...), 1, JSON_MAX_DEPTH)
            cfg.depth = inst.encode_max_depth(...)
            return cfg.depth
        end
        function m.decode_max_depth(...)
            int_arg("decode_max_depth", (...), 1, JSON_MAX_DEPTH)
            return inst.decode_max_depth(...)
        end
        function m.encode_sparse_array(...)
            int_arg("encode_sparse_array", select(2, ...), 0, INT_MAX)
            int_arg("encode_sparse_array", select(3, ...), 0, INT_MAX)
            local convert, ratio, safe_index = inst.encode_sparse_array(...)
            cfg.ratio, cfg.safe = ratio, safe_index
            return convert, ratio, safe_index
        end
        function m.encode(...)
            local why = select("#", ...) == 1 and long_array((...), 1, cfg)
            if why then
                if safe then return nil, why end
                error(why, 0)
            end
            return inst.encode(...)
        end
        return m
    end
    return M.new()
end
local kit_json = { cjson = json_module(require("cjson"), false),
    ["cjson.safe"] = json_module(require("cjson.safe"), true) }

-- The hook a route loaded with kit.load is running (nil: none, a spec calling methods directly): only
-- on_request may change the request, as in the gateway.
local running_hook

local function in_on_request(what)
    if running_hook ~= nil and running_hook ~= "on_request" then
        error(("%s can only be called in on_request"):format(what), 4)
    end
end

-- Retry-After as the gateway reads it (core/retry_after.c, rule for rule): delay-seconds, or an HTTP-date
-- in any of its three forms (IMF-fixdate, RFC 850 with its two-digit year resolved into the 100 years
-- around now, asctime), spaces and tabs around it trimmed; milliseconds from now (0 for a past date), or
-- nil when it is none of them.
local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6, Jul = 7, Aug = 8, Sep = 9, Oct = 10,
    Nov = 11, Dec = 12 }
local WDAY_SHORT = { Sun = true, Mon = true, Tue = true, Wed = true, Thu = true, Fri = true, Sat = true }
local WDAY_LONG = { Sunday = true, Monday = true, Tuesday = true, Wednesday = true, Thursday = true,
    Friday = true, Saturday = true }

local function days_from_civil(y, m, d)
    local a = m <= 2 and 1 or 0
    local yy, mm = y - a, m + 12 * a - 3
    local era = math.floor(yy / 400)
    local yoe = yy - era * 400
    local doy = math.floor((153 * mm + 2) / 5) + d - 1
    local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
end

local function days_in_month(y, m)
    if m == 2 then
        local leap = (y % 4 == 0 and y % 100 ~= 0) or y % 400 == 0
        return leap and 29 or 28
    end
    return ({ 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 })[m]
end

function kit.retry_after_ms(v, now)
    if type(v) ~= "string" then return nil end
    v = v:match("^[ \t]*(.-)[ \t]*$")
    if v == "" then return nil end
    if v:match("^%d") then
        if not v:match("^%d+$") then return nil end
        local n = tonumber(v)
        if #v:gsub("^0+", "") > 15 or n > 9223372036854775 then return nil end
        return n * 1000
    end
    local wd, rest = v:match("^(%a+)(.*)$")
    local d, mon, y, hh, mi, ss
    if WDAY_LONG[wd] then
        local yy
        d, mon, yy, hh, mi, ss = rest:match("^, (%d%d)%-(%a%a%a)%-(%d%d) (%d%d):(%d%d):(%d%d) GMT$")
        if not d then return nil end
        local this_year = tonumber(os.date("!%Y", now))
        y = this_year - this_year % 100 + tonumber(yy)
        if y > this_year + 50 then y = y - 100 elseif y <= this_year - 50 then y = y + 100 end
    elseif WDAY_SHORT[wd] then
        if rest:sub(1, 1) == "," then
            d, mon, y, hh, mi, ss = rest:match("^, (%d%d) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT$")
        else
            mon, d, hh, mi, ss, y = rest:match("^ (%a%a%a) ([ %d]%d) (%d%d):(%d%d):(%d%d) (%d%d%d%d)$")
            if d and d:sub(1, 1) == " " then d = d:sub(2) end
        end
        if not d then return nil end
        y = tonumber(y)
    else
        return nil
    end
    local m = MONTHS[mon]
    d, hh, mi, ss = tonumber(d), tonumber(hh), tonumber(mi), tonumber(ss)
    if not m or not d or d < 1 or d > days_in_month(y, m) or hh > 23 or mi > 59 then return nil end
    if ss == 60 and hh == 23 and mi == 59 then ss = 59 elseif ss > 59 then return nil end
    local t = days_from_civil(y, m, d) * 86400 + hh * 3600 + mi * 60 + ss
    if t <= now then return 0 end
    return (t - now) * 1000
end

-- What a script may make the gateway copy (core/script_api.h): a field (name and value), and req:respond's
-- fields together, at most a client's field section; 100 names in a request's edits (and in its answer's);
-- a request's set_header calls copying 64 KiB in all.
local FIELD_MAX, EDITS_NAMES, EDITS_MAX = 32768, 100, 65536

-- A set_header's field, as the gateway checks it: its size, a token name, not a framing field, no control
-- bytes.
local function check_field(what, name, value)
    if #name + #(value or "") > FIELD_MAX then
        error(("%s: a field of %d bytes (name and value) is over the %d a client's field section may hold")
            :format(what, #name + #(value or ""), FIELD_MAX), 4)
    end
    if not name:match("^[!#$%%&'*+%-.^_`|~%w]+$") then
        error(('%s: "%s" is not a valid field name'):format(what, name), 4)
    end
    if RESERVED[name:lower()] then error(("%s: %s is the gateway's to set"):format(what, name), 4) end
    if value and value:find("[%z\1-\8\10-\31\127]") then
        error(("%s: the value of %s has control characters"):format(what, name), 4)
    end
end

-- What the current request's set_header calls copied (the gateway's one count for its req and res edits).
local copied = 0

-- Sets (value) or removes (false) a field in edits as the gateway's edit_in: a new name costs its length, a
-- value longer than any its name had costs its length (rooms[name] is that longest).
local function edit(what, edits, rooms, name, value)
    local n = name:lower()
    local new = edits[n] == nil
    local cost = new and #name or 0
    if value and (new or #value > rooms[n]) then cost = cost + #value end
    if copied + cost > EDITS_MAX then
        error(("%s: the request's set_header calls would copy more than the %d bytes they may (each new "
            .. "name, and each value longer than its name had)"):format(what, EDITS_MAX), 4)
    end
    if new then
        local names = 0
        for _ in pairs(edits) do names = names + 1 end
        if names == EDITS_NAMES then
            error(("%s: a request's script sets or removes at most %d fields"):format(what, EDITS_NAMES), 4)
        end
        rooms[n] = 0
    end
    copied = copied + cost
    if value and #value > rooms[n] then rooms[n] = #value end
    edits[n] = value or false
end

-- One binding per object: st holds what the gateway would hold for that request or response.
local function binding(st)
    local B = {}
    function B.req_header(name)
        local n = name:lower()
        if st.edits[n] ~= nil then return st.edits[n] or nil end
        return st.headers[n]
    end
    function B.req_set_header(name, value)
        in_on_request("req:set_header")
        check_field("req:set_header", name, value)
        edit("req:set_header", st.edits, st.rooms, name, value)
        if name:lower() == st.key_header:lower() then -- the key field is the key, as in the gateway
            st.key = value
            st.key_removed = value == nil
        end
    end
    function B.req_body() return st.body end
    function B.ctx() return {} end
    function B.req_client() return "127.0.0.1" end
    function B.req_id() return ("%032x"):format(0) end
    function B.req_headers()
        local out = {}
        for k, v in pairs(st.headers) do out[k] = v end
        return out
    end
    function B.req_set_idempotency_key(key)
        in_on_request("req:set_idempotency_key")
        if #key > 255 or key:find("[%z\1-\8\10-\31\127]") then
            error("req:set_idempotency_key: a key is 1 to 255 printable characters", 3)
        end
        edit("req:set_idempotency_key", st.edits, st.rooms, st.key_header, key)
        st.key = key
        st.key_removed = false
    end
    function B.req_idempotency_key()
        if st.key then return st.key end
        if st.key_removed then return nil end
        return st.headers[st.key_header:lower()]
    end
    function B.req_respond(status, list, body)
        in_on_request("req:respond")
        local headers, size = {}, 0
        if (status == 204 or status == 304) and #body > 0 then
            error(("req:respond: a %d has no body"):format(status), 3)
        end
        if #body > 1048576 then
            error(("req:respond: a body of %d bytes is over the 1048576 a script may send"):format(#body), 3)
        end
        if #list / 2 > EDITS_NAMES then error(("req:respond: at most %d fields"):format(EDITS_NAMES), 3) end
        for i = 1, #list, 2 do
            local n = list[i]:lower()
            size = size + #list[i] + #list[i + 1]
            if size > FIELD_MAX then
                error(("req:respond: the fields are over the %d bytes (names and values) a client's field "
                    .. "section may hold"):format(FIELD_MAX), 3)
            end
            if not list[i]:match("^[!#$%%&'*+%-.^_`|~%w]+$") or list[i + 1]:find("[%z\1-\8\10-\31\127]") then
                error(('req:respond: "%s" is not a valid header'):format(list[i]), 3)
            end
            if RESERVED[n] or n == "date" or n == "server" then
                error(("req:respond: %s is the gateway's to set"):format(list[i]), 3)
            end
            headers[list[i]] = list[i + 1]
        end
        st.answer = { status = status, headers = headers, body = body }
    end
    function B.res_header(name) return st.headers[name:lower()] end
    function B.res_set_header(name, value)
        if running_hook ~= "on_response" then
            error("res:set_header can only be called in on_response", 3)
        end
        check_field("res:set_header", name, value)
        st.res_edits = st.res_edits or {}
        st.res_rooms = st.res_rooms or {}
        edit("res:set_header", st.res_edits, st.res_rooms, name, value)
    end
    function B.res_retry_after()
        local ms = kit.retry_after_ms(st.headers["retry-after"], os.time())
        return ms and ms / 1000 or nil
    end
    function B.res_body()
        -- as the gateway: only a body of at most classify_body_max is read for classify
        if st.body == nil or #st.body > (st.classify_body_max or 0) then return nil end
        return st.body
    end
    B.uuid = uuid
    B.sha256 = kit.sha256
    B.hmac_sha256 = kit.hmac_sha256
    function B.now()
        local ok, socket = pcall(require, "socket")
        return ok and socket.gettime() or os.time()
    end
    function B.log(level, msg) kit.logs[#kit.logs + 1] = { level = level, message = kit.as_logged(msg) } end
    -- lua_shared_dict, in this process: any name is declared; kit.shared[name] holds what it keeps
    local function entry(name, key)
        local d = kit.shared[name]
        local e = d and d[key]
        if e and e.expires and e.expires <= B.now() then d[key] = nil return nil end
        return e
    end
    function B.shared_check(name) kit.shared[name] = kit.shared[name] or {} end
    function B.shared_get(name, key)
        local e = entry(name, key)
        return e and e.value
    end
    function B.shared_set(name, key, value, ttl)
        if #key == 0 or #key > 64 then error("ricochet.shared: a key is 1 to 64 bytes", 3) end
        local t = type(value)
        if value ~= nil and t ~= "string" and t ~= "number" and t ~= "boolean" then
            error(("a shared value is a string, a number or a boolean, not a %s"):format(t), 3)
        end
        if t == "string" and #value > 224 then error("ricochet.shared: a string value is at most 224 bytes", 3) end
        -- as the gateway: whole milliseconds, rounded up (api.lua checked ttl: nil or 0 to 1e9)
        kit.shared[name][key] = value ~= nil and { value = value,
            expires = ttl and ttl > 0 and B.now() + math.ceil(ttl * 1000) / 1000 or nil } or nil
    end
    function B.shared_incr(name, key, n, init)
        local e = entry(name, key)
        if not e then
            if init == nil then return nil, "not found" end
            kit.shared[name][key] = { value = init + n }
            return init + n
        end
        if type(e.value) ~= "number" then error(("ricochet.shared: incr of \"%s\", which is not a number"):format(key), 3) end
        e.value = e.value + n
        return e.value
    end
    return B
end

-- As in the gateway, there is one req, one res and one attempt, reused from call to call: kit.request,
-- kit.response and kit.attempt make the object stand for a new request (a req kept from before reads the
-- new one), so a script that keeps an object across requests misbehaves offline as it would live.
local current = { req = { headers = {}, edits = {}, rooms = {}, key_header = "Idempotency-Key" },
    res = { headers = {} } }
local function follows(kind) -- a state that is always the current one of its kind
    return setmetatable({}, { __index = function(_, k) return current[kind][k] end,
        __newindex = function(_, k, v) current[kind][k] = v end })
end
local api
do
    local B, for_res = binding(follows("req")), binding(follows("res"))
    for name, fn in pairs(for_res) do
        if name:match("^res_") then B[name] = fn end
    end
    api = make_api(B)
end

local function refill(fields, values)
    for k in pairs(fields) do rawset(fields, k, nil) end
    for k, v in pairs(values) do rawset(fields, k, v) end
end

-- The path as routing matches it and req.path shows it, as the gateway's ric_route_normalize (core/route.c)
-- makes it (tests/path_cases.txt is run against both): escapes of unreserved characters and of bytes beyond
-- ASCII decoded, other escapes kept with uppercase hex, "." and ".." segments resolved, repeated slashes merged. Returns the
-- path, or nil and why the gateway answers 400: a bad escape, an encoded NUL or "/", a backslash, or ".."
-- above the root. A target that is not a path ("*") is kept as it is.
function kit.normalize_path(path)
    if path:sub(1, 1) ~= "/" then return path end
    if path:find("\\", 1, true) then return nil, "a backslash" end
    local parts, i = {}, 1
    while true do
        local p = path:find("%", i, true)
        if not p then parts[#parts + 1] = path:sub(i); break end
        parts[#parts + 1] = path:sub(i, p - 1)
        local hex = path:sub(p + 1, p + 2)
        if not hex:match("^%x%x$") then return nil, "a bad escape" end
        local v = tonumber(hex, 16)
        if v == 0 then return nil, "an encoded NUL" end
        if v == 0x2f then return nil, "an encoded /" end
        local ch = string.char(v)
        parts[#parts + 1] = (v >= 0x80 or ch:match("^[A-Za-z0-9._~-]$")) and ch or ("%%%02X"):format(v)
        i = p + 3
    end
    local out, trailing = {}, false
    for seg in (table.concat(parts):sub(2) .. "/"):gmatch("([^/]*)/") do
        if seg == ".." then
            if #out == 0 then return nil, "\"..\" above the root" end
            out[#out] = nil
            trailing = true
        elseif seg == "." or seg == "" then
            trailing = true
        else
            out[#out + 1] = seg
            trailing = false
        end
    end
    return "/" .. table.concat(out, "/") .. (trailing and #out > 0 and "/" or "")
end

-- req.host: a Host value or an absolute-form authority as routing uses it, lowercase, without its port
local function host_name(h)
    if h:sub(1, 1) == "[" then
        h = h:sub(1, h:find("]", 1, true) or #h)
    else
        h = h:sub(1, (h:find(":", 1, true) or #h + 1) - 1)
    end
    return (h:gsub("%.$", "")):lower()
end

-- kit.request{ method = "GET", path = "/", query = "", target = nil, host = nil, headers = { Name = "value" },
--              body = nil, key_header = "Idempotency-Key", deadline_header = "X-Request-Timeout",
--              attempt_header = "X-Ricochet-Attempt" (or "off"), ctx = {} } -> req, with the exact API of the gateway's
-- req (req.ctx: the request's own table; pass the same one to kit.attempt{ ctx = req.ctx } as the gateway does).
-- target, the request target as sent ("/a/./b?q" or "http://host/a?q"), gives path, query and (absolute-form)
-- host as the gateway does, so give it or path and query, not both; otherwise target is path["?" query].
-- req.path is normalized as the gateway's (kit.normalize_path): a path the gateway answers 400 is an error.
-- req.host: host, else the absolute-form target's authority, else the Host field, lowercase without the port.
function kit.request(t)
    t = t or {}
    local headers = lower_map(t.headers)
    local target, path, query, host = t.target, t.path or "/", t.query or "", t.host
    if target ~= nil then
        if t.path ~= nil or t.query ~= nil then error("kit.request: give target, or path and query, not both", 2) end
        local authority, rest = target:match("^%a[%w+.-]*://([^/?]*)(.*)$")
        host = host or authority
        rest = rest or target
        path, query = rest:match("^([^?]*)%??(.*)$")
        if path == "" then path = "/" end
    else
        target = path .. (query ~= "" and "?" .. query or "")
    end
    local normal, why = kit.normalize_path(path)
    if target:find("#", 1, true) then normal, why = nil, "a fragment: no request target has one" end
    if not normal then
        error(("kit.request: the gateway answers 400 to the path %q (%s)"):format(path, why), 2)
    end
    host = host or headers.host or ""
    current.req = { headers = headers, edits = {}, rooms = {}, body = t.body,
        key_header = t.key_header or "Idempotency-Key",
        deadline_header = t.deadline_header or "X-Request-Timeout",
        attempt_header = t.attempt_header or "X-Ricochet-Attempt" }
    copied = 0
    refill(api.req_fields, { method = t.method or "GET", path = normal, query = query, target = target,
        host = host_name(host),
        ctx = t.ctx or {}, client = t.client or "127.0.0.1",
        id = t.id or ("%032x"):format(math.random(0, 2 ^ 31)) })
    return api.req
end

-- kit.response{ status = 200, headers = { Name = "value" }, body = nil, classify_body_max = 0 } -> res;
-- as in the gateway, res:body() has the body only when it is at most classify_body_max (the location's)
function kit.response(t)
    t = t or {}
    current.res = { headers = lower_map(t.headers), body = t.body, classify_body_max = t.classify_body_max }
    refill(api.res_fields, { status = t.status or 200, ctx = t.ctx })
    return api.res
end

-- kit.attempt{ number = 1, class = "status", elapsed = 0, remaining = 30, upstream = "127.0.0.1:9000",
--              ctx = {} } -> attempt, read-only as the gateway's
function kit.attempt(t)
    t = t or {}
    refill(api.attempt_fields, { number = t.number or 1, class = t.class or "status",
        elapsed = t.elapsed or 0, remaining = t.remaining or 30, upstream = t.upstream or "127.0.0.1:9000",
        ctx = t.ctx or {} })
    return api.attempt
end

-- What on_request did to the fields sent upstream: { name (lowercase) = value }, with the client's fields,
-- the script's set_header and key (a removed field is absent).
function kit.upstream(req)
    assert(req == api.req, "kit.upstream takes a req made by kit.request")
    local st = current.req
    local out = {}
    for k, v in pairs(st.headers) do out[k] = v end
    for k, v in pairs(st.edits) do out[k] = v or nil end
    -- the gateway writes these itself on every attempt: neither the client's nor the script's goes
    out[st.deadline_header:lower()] = nil
    if st.attempt_header ~= "off" then out[st.attempt_header:lower()] = nil end
    return out
end

-- The answer's fields as the client gets them after on_response: { name (lowercase) = value }.
function kit.downstream(res)
    assert(res == api.res, "kit.downstream takes a res made by kit.response")
    local st = current.res
    local out = {}
    for k, v in pairs(st.headers) do out[k] = v end
    for k, v in pairs(st.res_edits or {}) do out[k] = v or nil end
    return out
end

-- The answer req:respond gave, { status, headers, body }, or nil.
function kit.answer(req)
    assert(req == api.req, "kit.answer takes a req made by kit.request")
    return current.req.answer
end

-- The gateway's error handler, without its traceback: an error object that is not a string (error({}),
-- error(nil)) is named by its type with the FILE:LINE of the script's line that raised it (the first frame
-- in one of the script's files, sources: the sandbox passes a callback's error on from its own line).
local function error_text(sources)
    return function(e)
        if type(e) == "string" or type(e) == "number" then return e end
        local what = "(error object is a " .. type(e) .. " value)"
        for level = 2, math.huge do
            local info = debug.getinfo(level, "Sl")
            if not info then return what end
            if info.currentline > 0 and info.source:sub(1, 1) == "@" and sources[info.source:sub(2)] then
                return info.short_src .. ":" .. info.currentline .. ": " .. what
            end
        end
    end
end

-- A call of the script's (its main chunk, a hook) as the gateway makes it: after one that failed, what the
-- sandbox had in flight is put back (sandbox.unwind), so the next call finds it as before.
local function call(handler, fn, ...)
    local results = { xpcall(fn, handler, ...) }
    if not results[1] then
        sandbox.unwind()
        error(results[2], 0)
    end
    return unpack(results, 2, table.maxn(results))
end

-- kit.log_ctx{ method, path, status, duration, upstream, not_retried, verdict, reason, attempts, headers, ctx }
-- -> the ctx on_log gets, with the gateway's ctx:set (its rules, its messages); kit.log_fields(ctx) -> what
-- ctx:set added to the request's access log line, { name = value }. As in the gateway, a ctx stands for its
-- request only: once a newer kit.log_ctx is made, a ctx kept from before refuses :set.
local log_gen, log_fields = 0, setmetatable({}, { __mode = "k" })

local function ctx_set(gen, fields, order)
    return function(_, name, value)
        if running_hook ~= nil and running_hook ~= "on_log" then
            error("ctx:set can only be called in on_log", 2)
        end
        if gen ~= log_gen then
            error("ctx:set: this ctx is an earlier request's (kept from its on_log): only the ctx on_log is "
                .. "given may be set", 2)
        end
        if type(name) == "number" then name = tostring(name) end
        if type(name) ~= "string" then
            error(("bad argument #2 to 'set' (string expected, got %s)"):format(type(name)), 2)
        end
        if #name == 0 or #name > 64 or name:find("[^%w_.-]") then
            error("ctx:set: a name is 1 to 64 letters, digits, '_', '.' or '-'", 2)
        end
        local t, text = type(value), nil
        if t == "string" then
            if #value > 256 then error("ctx:set: a string value is at most 256 bytes", 2) end
            text = value
        elseif t == "number" then
            if value ~= value or value == math.huge or value == -math.huge then
                error("ctx:set: a number must be finite (JSON has no inf or nan)", 2)
            end
            text = ("%.14g"):format(value)
        elseif t == "boolean" then
            text = tostring(value)
        else
            error(("ctx:set: a value is a string, a number or a boolean, not a %s"):format(t), 2)
        end
        local old, bytes = fields[name], 0
        if old == nil and #order == 16 then error("ctx:set: at most 16 fields", 2) end
        for _, n in ipairs(order) do
            if n ~= name then bytes = bytes + #n + #fields[n].text end
        end
        if bytes + #name + #text > 2048 then error("ctx:set: the script's fields are over 2048 bytes", 2) end
        if old == nil then order[#order + 1] = name end
        fields[name] = { value = value, text = text }
    end
end

function kit.log_ctx(t)
    t = t or {}
    log_gen = log_gen + 1
    local fields, order = {}, {}
    local c = { method = t.method or "GET", path = t.path or "/", status = t.status or 200,
        duration = t.duration or 0, upstream = t.upstream, not_retried = t.not_retried, verdict = t.verdict,
        reason = t.reason, attempts = t.attempts or {}, headers = t.headers or {}, ctx = t.ctx or {},
        set = ctx_set(log_gen, fields, order) }
    log_fields[c] = fields
    return c
end

function kit.log_fields(c)
    local fields = assert(log_fields[c], "kit.log_fields takes a ctx made by kit.log_ctx")
    local out = {}
    for name, f in pairs(fields) do out[name] = f.value end
    return out
end

-- Loads a route script as the gateway does (same sandbox, same checks; no time bound here).
function kit.load(path)
    local ricochet = api.ricochet
    local sources = {}
    local chunk, err = sandbox.prepare(path, ricochet, nil, sources, kit_json)
    if not chunk then error(err, 2) end
    local handler = error_text(sources)
    local route = call(handler, chunk)
    local ok, why = sandbox.check(path, route)
    if not ok then error(why, 2) end
    -- each hook knows it runs, so the binding applies the gateway's rule of which hook may change what
    local hooks = {}
    for name, fn in pairs(route) do
        hooks[name] = function(...)
            local outer = running_hook
            running_hook = name
            local results = { pcall(call, handler, fn, ...) }
            running_hook = outer
            if not results[1] then error(results[2], 0) end
            return unpack(results, 2, table.maxn(results))
        end
    end
    return hooks
end

return kit
