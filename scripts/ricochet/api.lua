-- ricochet/api.lua: the objects a route script's hooks get (req, res, attempt, ricochet), over a binding.
--
-- The gateway runs this file with its C binding; the test kit (ricochet.testing) runs the very same file
-- with a binding written in Lua. A binding B provides, for "the request being handled":
--   B.req_header(name)                  -> string | nil   (case-insensitive; the first value)
--   B.req_set_header(name, value|nil)
--   B.req_body()                        -> string | nil   (nil: no body, or streamed)
--   B.req_headers()                     -> { name (lowercase) = value | { value, ... } } (the client's)
--   B.req_set_idempotency_key(key)      B.req_idempotency_key() -> string | nil
--   B.req_respond(status, headers, body)
--   B.res_header(name)                  -> string | nil
--   B.res_set_header(name, value|nil)   (on_response only)
--   B.res_retry_after()                 -> seconds | nil
--   B.res_body()                        -> string | nil
--   B.shared_check(name), B.shared_get(name, key), B.shared_set(name, key, value|nil, ttl|nil)
--                                         (ttl checked here: a number of seconds, 0 to 1e9),
--   B.shared_incr(name, key, n, init) -> number | nil, "not found"
--   B.uuid(), B.sha256(s), B.hmac_sha256(key, s), B.now(), B.log(level, message)
-- and the gateway fills the fields (req.method, res.status, attempt.number...) before each call.
-- an instance of its own: scripts get instances of theirs, so no decode_max_depth of theirs reaches this
local decode = require("cjson.safe").new().decode

return function(B)
    local api = {}

    local function check_string(v, what, level)
        if type(v) ~= "string" then
            error(("%s must be a string, got %s"):format(what, type(v)), level + 1)
        end
    end

    -- a body decoded, or nil (none, or not JSON)
    local function json_of(body)
        if body == nil then return nil end
        local v = decode(body)
        return v
    end

    -- The objects are one of each per state, reused from call to call: a script reaches their fields and
    -- methods through an empty proxy, never the tables behind them (its metatable is locked, the fields
    -- and method tables are nobody's field), and writes only the fields listed as writable. The gateway
    -- fills the fields table (api.req_fields, ...) before each call.
    -- fields made on first read, by name: what a script never reads, its request never pays for
    local LAZY = { ctx = B.ctx }
    local LAZY_REQ = { ctx = B.ctx, client = B.req_client, id = B.req_id }

    local function object(name, methods, writable)
        -- fields, then methods: two plain lookups (no Lua function per read), and neither table is a
        -- field of anything the script can reach
        -- ctx, the request's own table, is made on first read (B.ctx), so a script that never reads it
        -- costs its request nothing; every other read is two plain lookups
        local fields
        local lazy = name == "req" and LAZY_REQ or LAZY
        setmetatable(methods, { __metatable = "ricochet." .. name, __index = function(_, k)
            local make = lazy[k]
            if make then
                local v = make()
                rawset(fields, k, v)
                return v
            end
        end })
        fields = setmetatable({}, { __index = methods, __metatable = "ricochet." .. name })
        local proxy = setmetatable({}, {
            __metatable = "ricochet." .. name,
            __index = fields,
            __newindex = function(_, k, v)
                if not writable[k] then
                    error(("%s.%s cannot be set: %s is the gateway's (keep your own state in "
                        .. "%s.ctx)"):format(name, tostring(k), name, name), 2)
                end
                fields[k] = v
            end,
        })
        return proxy, fields
    end

    -- req -----------------------------------------------------------------------------------------------------
    local Req = {}
    local proxies = {} -- the objects, so a method called with a dot says so

    local function method(self, obj, name)
        if self ~= proxies[obj] then
            error(("%s is a method: call it with a colon, %s(...)"):format(name, name), 3)
        end
    end

    function Req:header(name)
        method(self, "req", "req:header")
        check_string(name, "req:header's name", 2)
        return B.req_header(name)
    end

    -- a set_header's arguments: a string name, a string (or number) value or nil; the value to send
    local function field_value(what, name, value)
        check_string(name, what .. "'s name", 3)
        if value ~= nil then
            if type(value) == "number" then value = tostring(value) end
            check_string(value, what .. "'s value", 3)
        end
        return value
    end

    function Req:set_header(name, value)
        method(self, "req", "req:set_header")
        B.req_set_header(name, field_value("req:set_header", name, value))
    end

    function Req:body()
        return B.req_body()
    end

    function Req:headers()
        return B.req_headers()
    end

    -- the query, decoded: name -> value ("+" is a space, %XX a byte), true for a name without "=", a list
    -- when a name repeats; at most 100 arguments, as OpenResty's default
    local function unescape(v)
        return (v:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
    end

    function Req:args()
        local out, n = {}, 0
        for pair in (self.query or ""):gmatch("[^&]+") do
            n = n + 1
            if n > 100 then break end
            local k, v = pair:match("^([^=]*)=(.*)$")
            if k then k, v = unescape(k), unescape(v) else k, v = unescape(pair), true end
            local old = out[k]
            if old == nil then
                out[k] = v
            elseif type(old) == "table" then
                old[#old + 1] = v
            else
                out[k] = { old, v }
            end
        end
        return out
    end

    function Req:json()
        return json_of(B.req_body())
    end

    function Req:set_idempotency_key(key)
        method(self, "req", "req:set_idempotency_key")
        check_string(key, "req:set_idempotency_key's key", 2)
        if key == "" then error("req:set_idempotency_key: the key is empty", 2) end
        B.req_set_idempotency_key(key)
    end

    function Req:idempotency_key()
        return B.req_idempotency_key()
    end

    function Req:respond(status, headers, body)
        method(self, "req", "req:respond")
        if type(status) ~= "number" or status < 200 or status > 599 or status % 1 ~= 0 then
            error("req:respond's status must be a number from 200 to 599", 2)
        end
        if headers ~= nil and type(headers) ~= "table" then
            error("req:respond's headers must be a table of name = value", 2)
        end
        if body ~= nil then check_string(body, "req:respond's body", 2) end
        local list, seen = {}, {}
        for name, value in pairs(headers or {}) do
            -- counted here, not after: this library is compiled, and no hook stops a compiled loop
            -- over a table as large as the script could make it
            if #list == 200 then error("req:respond: at most 100 fields", 2) end
            check_string(name, "a req:respond header name", 2)
            if type(value) == "number" then value = tostring(value) end
            check_string(value, "a req:respond header value", 2)
            -- names are case-insensitive, and which of two spellings pairs gives last is not defined
            local other = seen[name:lower()]
            if other then
                error(("req:respond: %s and %s are one field (names are case-insensitive): give it "
                    .. "once"):format(other, name), 2)
            end
            seen[name:lower()] = name
            list[#list + 1] = name
            list[#list + 1] = value
        end
        B.req_respond(status, list, body or "")
    end

    -- res -----------------------------------------------------------------------------------------------------
    local Res = {}

    function Res:header(name)
        method(self, "res", "res:header")
        check_string(name, "res:header's name", 2)
        return B.res_header(name)
    end

    function Res:set_header(name, value)
        method(self, "res", "res:set_header")
        B.res_set_header(name, field_value("res:set_header", name, value))
    end

    function Res:retry_after()
        return B.res_retry_after()
    end

    function Res:body()
        return B.res_body()
    end

    function Res:json()
        return json_of(B.res_body())
    end

    -- the objects: one of each, reused from call to call (the gateway refills their fields)
    api.req, api.req_fields = object("req", Req, { idempotent = true })
    api.res, api.res_fields = object("res", Res, {})
    proxies.req, proxies.res = api.req, api.res
    api.attempt, api.attempt_fields = object("attempt", {}, {})

    -- ricochet ------------------------------------------------------------------------------------------------
    local levels = { debug = true, info = true, notice = true, warn = true, error = true }
    api.ricochet = {
        uuid = function() return B.uuid() end,
        sha256 = function(s)
            check_string(s, "ricochet.sha256's argument", 2)
            return B.sha256(s)
        end,
        hmac_sha256 = function(key, s)
            check_string(key, "ricochet.hmac_sha256's key", 2)
            check_string(s, "ricochet.hmac_sha256's message", 2)
            return B.hmac_sha256(key, s)
        end,
        now = function() return B.now() end,
        log = function(level, ...)
            if not levels[level] then
                error("ricochet.log's level must be debug, info, notice, warn or error", 2)
            end
            local parts = { ... }
            for i = 1, select("#", ...) do parts[i] = tostring(parts[i]) end
            B.log(level, table.concat(parts, " "))
        end,
    }

    -- ricochet.shared(NAME): a lua_shared_dict, the same for every worker (one handle per name)
    local dicts = {}
    local function dict(name)
        local d = dicts[name]
        if d then return d end
        local methods = {
            get = function(self, key)
                check_string(key, "a shared key", 2)
                return B.shared_get(name, key)
            end,
            set = function(self, key, value, ttl)
                check_string(key, "a shared key", 2)
                -- one rule here for the gateway and the kit: none or 0 is for ever; under 1 ms is 1 ms
                if ttl ~= nil and (type(ttl) ~= "number" or ttl ~= ttl or ttl < 0 or ttl > 1e9) then
                    error(("a shared value's ttl is a number of seconds from 0 to 1e9 (0 or none: "
                        .. "for ever), not %s"):format(type(ttl) == "number" and tostring(ttl)
                        or "a " .. type(ttl)), 2)
                end
                B.shared_set(name, key, value, ttl)
            end,
            incr = function(self, key, n, init)
                check_string(key, "a shared key", 2)
                return B.shared_incr(name, key, n or 1, init)
            end,
            delete = function(self, key)
                check_string(key, "a shared key", 2)
                B.shared_set(name, key, nil)
            end,
        }
        d = setmetatable({}, { __metatable = "ricochet.shared", __index = methods,
            __newindex = function() error("a shared dictionary's methods cannot be changed", 2) end })
        dicts[name] = d
        return d
    end
    api.ricochet.shared = function(name)
        check_string(name, "ricochet.shared's name", 2)
        B.shared_check(name)
        return dict(name)
    end

    -- The verdicts classify may return.
    api.verdicts = { retry = true, accept = true, fail = true }

    return api
end
