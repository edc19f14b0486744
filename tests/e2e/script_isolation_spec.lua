-- Route scripts cannot reach each other (issue 20, findings 2 and 3): route A tampers with every object and
-- library it can reach (the req/res method tables, rawset on them, cjson's configuration), route B keys
-- payments from their JSON bodies and retries only what its classify says. B's answers, keys and retries
-- must not change; the real binary, one worker, so both scripts live in one Lua state.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local TAMPER = [[
local route = {}
local function try(name, f, out)
    local ok = pcall(f)
    out[#out + 1] = name .. "=" .. (ok and "done" or "refused")
end
function route.on_request(req)
    local out = {}
    try("index", function()
        local methods = req.__index
        methods.json = function() return { order_id = "X" } end
    end, out)
    try("metatable", function()
        local mt = getmetatable(req)
        mt.__index.json = function() return { order_id = "X" } end
    end, out)
    try("rawset", function() rawset(req, "json", function() return { order_id = "X" } end) end, out)
    try("assign", function() req.json = function() return { order_id = "X" } end end, out)
    try("setmetatable", function() setmetatable(req, {}) end, out)
    try("cjson", function() require("cjson.safe").decode_max_depth(1) require("cjson").decode_max_depth(1) end, out)
    req:set_header("X-Tamper", table.concat(out, ","))
end
function route.classify(res)
    if res == nil then return nil end
    pcall(function() res.__index.header = function() return "yes" end end)
    pcall(function() rawset(res, "header", function() return "yes" end) end)
    pcall(function() res.status = 200 end)
end
return route
]]

local PAYMENTS = [[
local route = {}
function route.on_request(req)
    local body = req:json()
    if type(body) == "table" and body.order and body.order.id then
        req:set_idempotency_key("order-" .. body.order.id)
    end
    req:set_header("X-Nested", body and body.order and "yes" or "no")
end
function route.classify(res)
    if res == nil then return nil end
    if res.status == 503 and res:header("X-Retry") == "yes" then return "retry" end
end
return route
]]

local CTX = [[
local route = {}
function route.on_request(req)
    req.ctx.tenant = req:header("X-Tenant")
    req.ctx.seen = 1
end
function route.classify(res, attempt)
    attempt.ctx.seen = (attempt.ctx.seen or 0) + 1
    attempt.ctx.status = res and res.status
end
function route.on_log(ctx)
    ricochet.log("info", "ctx-check", ctx.path, tostring(ctx.ctx.tenant), tostring(ctx.ctx.seen),
        tostring(ctx.ctx.status))
    ctx:set("tenant", ctx.ctx.tenant)
    ctx:set("attempts", #ctx.attempts)
    ctx:set("cached", false)
    ctx:set("cached", true) -- set again: replaced
    local ok = pcall(ctx.set, ctx, "bad name!", 1)
    ctx:set("bad_name_refused", not ok)
    ok = pcall(ctx.set, ctx, "table", {})
    ctx:set("table_refused", not ok)
end
return route
]]

local VIEW = [[
local route = {}
function route.on_request(req)
    local h, a = req:headers(), req:args()
    req:set_header("X-Client", req.client)
    req:set_header("X-Id", req.id)
    req:set_header("X-Tags", type(h["x-tag"]) == "table" and table.concat(h["x-tag"], ",") or tostring(h["x-tag"]))
    req:set_header("X-Args", ("%s|%s|%s|%s"):format(a.q, tostring(a.flag), type(a.r) == "table" and
        table.concat(a.r, ",") or "?", tostring(a["s p"])))
end
return route
]]

local AUTHOR = [[
local route = {}
function route.on_request(req)
    if req.path == "/w/dot" then req.header("X-Anything") end
end
function route.classify(res)
    if res and res:body() then return "accept" end
end
return route
]]

local ONRESP = [[
local route = {}
function route.on_request(req) req.ctx.t0 = "seen" end
function route.on_response(res)
    res:set_header("X-Served-By", "ricochet")
    res:set_header("X-Upstream-Only", nil)
    res:set_header("X-Status-Was", res.status)
    res:set_header("X-Ctx", res.ctx.t0)
    if res:header("X-Break") then res:set_header("Content-Length", "1") end
end
function route.on_log(ctx)
    local h = ctx.headers
    ctx:set("served_by", tostring(h["x-served-by"]))
    ctx:set("upstream_only", tostring(h["x-upstream-only"]))
    ctx:set("keep", tostring(h["x-keep"]))
    ctx:set("status", ctx.status)
end
return route
]]

local KEYED = [[
local route = {}
function route.on_request(req) req:set_idempotency_key("order-1") end
return route
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 1ms 2ms;
        retry_on connect_error;
        location /a/ { script {{TAMPER}}; proxy_pass http://up; }
        location /b/ { script {{PAYMENTS}}; idempotency_key on; proxy_pass http://up; }
        location /c/ { script {{CTX}}; proxy_pass http://up; }
        location /k/ { script {{KEYED}}; retry_on 503; proxy_pass http://up; }
        location /v/ { script {{VIEW}}; proxy_pass http://up; }
        location /w/ { script {{AUTHOR}}; proxy_pass http://up; }
        location /r/ { script {{ONRESP}}; proxy_pass http://up; }
    }
}
]]

local sdir = H.mkdtemp("isolation")

describe("two route scripts in one worker", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        H.write_file(sdir .. "/tamper.lua", TAMPER)
        H.write_file(sdir .. "/payments.lua", PAYMENTS)
        H.write_file(sdir .. "/ctx.lua", CTX)
        H.write_file(sdir .. "/keyed.lua", KEYED)
        H.write_file(sdir .. "/view.lua", VIEW)
        H.write_file(sdir .. "/author.lua", AUTHOR)
        H.write_file(sdir .. "/onresp.lua", ONRESP)
        gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { TAMPER = sdir .. "/tamper.lua", PAYMENTS = sdir .. "/payments.lua",
                     CTX = sdir .. "/ctx.lua", KEYED = sdir .. "/keyed.lua",
                     VIEW = sdir .. "/view.lua", AUTHOR = sdir .. "/author.lua",
                     ONRESP = sdir .. "/onresp.lua" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(sdir)
    end)

    before_each(function() up:reset() end)

    local function pay(id)
        return assert(H.request(gw.port, { method = "POST", path = "/b/pay",
            headers = { { "Content-Type", "application/json" } },
            body = '{"order":{"id":"' .. id .. '","amount":10}}' }))
    end

    it("refuses every reach into the gateway's objects, and route B keeps its own keys", function()
        for _ = 1, 3 do
            local r = assert(H.request(gw.port, { method = "POST", path = "/a/x", body = "{}" }))
            assert.equal(200, r.status, ctx(gw))
        end
        local seen = H.hit_values(up:hits()[1], "X-Tamper")[1]
        assert.equal("index=refused,metatable=refused,rawset=refused,assign=refused,"
            .. "setmetatable=refused,cjson=done", seen, ctx(gw))
        up:reset()
        assert.equal(200, pay("123").status)
        assert.equal(200, pay("456").status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        -- B's nested body still decodes (A's decode_max_depth(1) was A's own), and its keys differ
        assert.same({ "yes" }, H.hit_values(hits[1], "X-Nested"))
        assert.same({ "order-123" }, H.hit_values(hits[1], "Idempotency-Key"))
        assert.same({ "order-456" }, H.hit_values(hits[2], "Idempotency-Key"))
    end)

    it("leaves route B's retries to B's classify after A patched res", function()
        up:program({ default = { status = 503, body = "busy" } })
        -- A's classify runs (and tampers) first
        assert(H.request(gw.port, { method = "GET", path = "/a/x" }))
        up:reset()
        up:program({ default = { status = 503, body = "busy" } })
        local r = assert(H.request(gw.port, { method = "GET", path = "/b/x" }))
        assert.equal(503, r.status)
        assert.equal(1, #up:hits(), ctx(gw, "B retried a 503 without X-Retry: yes"))
        up:reset()
        up:program({ default = { status = 503, headers = { ["X-Retry"] = "yes" }, body = "busy" } })
        r = assert(H.request(gw.port, { method = "GET", path = "/b/x" }))
        assert.equal(3, #up:hits(), ctx(gw, "B's own classify no longer retries"))
    end)

    it("gives each request its own ctx, the same table from on_request through classify to on_log", function()
        up:program({ default = { status = 201, body = "ok", delay_ms = 1000 } })
        -- 12 requests of two tenants in flight at once, so their hooks interleave in the one worker
        local conns = {}
        for i = 1, 12 do
            local tenant = i % 2 == 0 and "A" or "B"
            local c = assert(H.connect(gw.port))
            assert(c:send(H.build_request(gw.port, { method = "GET", path = "/c/" .. tenant .. "-" .. i,
                headers = { { "X-Tenant", tenant } } })))
            conns[i] = c
        end
        for i, c in ipairs(conns) do
            local r = c:read_response({ timeout = 10 })
            assert.truthy(r and r.status == 201, ctx(gw, "request " .. i))
            c:close()
        end
        local ok = H.wait_until(function()
            local _, n = gw:log():gsub("ctx%-check", "")
            return n >= 12
        end, 15)
        assert.truthy(ok, ctx(gw, "on_log did not run 12 times"))
        local n = 0
        for path, tenant, seen, status in gw:log():gmatch("ctx%-check (/c/%S+) (%S+) (%S+) (%S+)") do
            n = n + 1
            assert.equal(path:match("^/c/(%a)%-"), tenant, "a request logged as another tenant: " .. path)
            assert.equal("2", seen, path .. ": on_request's table did not reach classify")
            assert.equal("201", status, path)
        end
        assert.equal(12, n, ctx(gw))
        -- and ctx:set put the tenant in each request's own access log line, under "script"
        local entries = {}
        H.wait_until(function() -- a line is written as its request ends, a moment after the answer
            entries = {}
            for _, e in ipairs(H.access_entries(gw)) do
                if e.path and e.path:match("^/c/") then entries[#entries + 1] = e end
            end
            return #entries >= 12
        end, 15)
        for _, e in ipairs(entries) do
            assert.same({ tenant = e.path:match("^/c/(%a)%-"), attempts = 1, cached = true,
                bad_name_refused = true, table_refused = true }, e.script, H.json.encode(e))
        end
        assert.equal(12, #entries, H.json.encode(entries))
    end)

    it("tells the author when a script's key lacks the route's key contract", function()
        up:program({ default = { status = 503, body = "busy" } })
        for _ = 1, 2 do
            local r = assert(H.request(gw.port, { method = "POST", path = "/k/pay", body = "{}" }))
            assert.equal(503, r.status)
        end
        assert.equal(2, #up:hits(), ctx(gw, "a POST without the key contract was retried"))
        local reasons = 0
        H.wait_until(function()
            reasons = 0
            for _, e in ipairs(H.access_entries(gw, "/k/pay")) do
                if e.not_retried == "key_without_contract" then reasons = reasons + 1 end
            end
            return reasons >= 2
        end, 15)
        assert.equal(2, reasons, H.json.encode(H.access_entries(gw, "/k/pay")))
        local _, warnings = gw:log():gsub('has no idempotency_key on|auto, so its unsafe requests are not retried: '
            .. 'add "idempotency_key on;"', "")
        assert.equal(1, warnings, ctx(gw, "the warning is said once"))
    end)

    it("shows the script every field, the client's address and the query decoded", function()
        local r = assert(H.request(gw.port, { method = "GET", path = "/v/x?q=a%20b+c&flag&r=1&r=2&s%20p=%3D",
            headers = { { "X-Tag", "one" }, { "x-tag", "two" } } }))
        assert.equal(200, r.status)
        local hit = up:hits()[1]
        assert.same({ "127.0.0.1" }, H.hit_values(hit, "X-Client"))
        assert.same({ "one,two" }, H.hit_values(hit, "X-Tags"))
        assert.same({ "a b c|true|1,2|=" }, H.hit_values(hit, "X-Args"))
        -- req.id is the id of the request's access log line
        local id = H.hit_values(hit, "X-Id")[1]
        assert.truthy(id and id:match("^%x+$") and #id == 32, tostring(id))
        local found = H.wait_until(function()
            for _, e in ipairs(H.access_entries(gw)) do
                if e.id == id then return true end
            end
        end, 15)
        assert.truthy(found, "no access log line with id " .. id)
    end)

    it("says where the author looks: a method called with a dot, a body read without classify_body_max", function()
        assert(H.request(gw.port, { method = "GET", path = "/w/dot" }))
        assert.truthy(gw:log():find(sdir .. "/author.lua:3: req:header is a method: call it with a colon", 1, true),
            ctx(gw))
        -- at start (and at -t): the location and the directive to add
        assert.truthy(gw:log():find('[warn] ', 1, true) and gw:log():find('has no classify_body_max, so the '
            .. 'res:body() and res:json() of its script ' .. sdir .. '/author.lua are nil', 1, true), ctx(gw))
        -- at run time, once per location
        for _ = 1, 3 do assert(H.request(gw.port, { method = "GET", path = "/w/x" })) end
        local _, n = gw:log():gsub("res:body%(%) and res:json%(%) are nil on location \"/w/\"", "")
        assert.equal(1, n, ctx(gw))
    end)

    it("lets on_response set and remove the fields the client gets, never framing ones", function()
        up:program({ default = { status = 201, headers = { ["X-Upstream-Only"] = "secret", ["X-Keep"] = "1" },
            body = "made" } })
        local r = assert(H.request(gw.port, { method = "GET", path = "/r/x" }))
        assert.equal(201, r.status)
        assert.equal("made", r.body)
        assert.equal("ricochet", r.headers["x-served-by"])
        assert.equal("201", r.headers["x-status-was"])
        assert.equal("seen", r.headers["x-ctx"])
        assert.equal("1", r.headers["x-keep"])
        assert.is_nil(r.headers["x-upstream-only"])
        -- on_log sees the fields as the client got them
        local logged = H.wait_until(function()
            local e = H.access_entries(gw, "/r/x")[1]
            return e and e.script
        end, 15)
        assert.same({ served_by = "ricochet", upstream_only = "nil", keep = "1", status = 201 }, logged)
        -- a hook that tries a framing field fails: the answer goes as the upstream sent it
        up:program({ default = { status = 200, headers = { ["X-Break"] = "1", ["X-Upstream-Only"] = "kept" },
            body = "whole" } })
        r = assert(H.request(gw.port, { method = "GET", path = "/r/y" }))
        assert.equal(200, r.status)
        assert.equal("whole", r.body)
        assert.equal("kept", r.headers["x-upstream-only"])
        assert.is_nil(r.headers["x-served-by"])
        assert.truthy(gw:log():find("res:set_header: Content-Length is the gateway's to set", 1, true), ctx(gw))
    end)
end)
