-- on_response runs for every answer the client gets (issue 20, item 5): the upstream's, the gateway's own
-- (a 502 from a dead upstream, a script's req:respond) and the idempotency store's (a replay, a problem),
-- and on_log sees the fields as the client got them. The real binary, one worker, an LMDB store.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")

local SCRIPT = [[
local route = {}
function route.on_request(req)
    req.ctx.seen = "yes"
    if req.path == "/s/deny" then req:respond(403, { ["X-Why"] = "denied" }, "no") end
    if req.path == "/s/empty" then req:respond(204, {}, "") end
end
function route.on_response(res)
    res:set_header("X-Edited", "1")
    res:set_header("X-Status-Was", res.status)
    res:set_header("X-Type-Was", tostring(res:header("Content-Type")))
    res:set_header("X-Why-Was", tostring(res:header("X-Why")))
    res:set_header("X-Replayed-Was", tostring(res:header("Idempotent-Replayed")))
    res:set_header("X-Body-Was", tostring(res:body()))
    res:set_header("X-Ctx", tostring(res.ctx.seen))
    res:set_header("Server", nil)
    res:set_header("X-Drop", nil)
end
function route.on_log(ctx)
    local h = ctx.headers
    ctx:set("edited", tostring(h["x-edited"]))
    ctx:set("server", tostring(h["server"]))
    ctx:set("why", tostring(h["x-why"]))
end
return route
]]

local NEVER = [[
return { on_request = function(req) req.idempotent = false end }
]]

-- keeps the req of one request and reads it in hooks of later ones; fills res.ctx where on_request never ran
local KEEPER = [[
local kept
return {
    on_request = function(req) kept = req; req.ctx.secret = req:header("X-Secret") end,
    on_response = function(res)
        res.ctx.big = ("z"):rep(200000) .. tostring(math.random())
        if kept then
            res:set_header("X-Kept-Path", tostring(kept.path))
            res:set_header("X-Kept-Method", tostring(kept.method))
            res:set_header("X-Kept-Secret", tostring(kept.ctx.secret))
        end
    end,
    on_log = function(ctx) end,
}
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log logs/access.log;
    script_memory_max 16m;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    upstream dead { server 127.0.0.1:{{DEAD}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        retry_attempts 2;
        idempotency_store lmdb:{{STORE}};
        location /s/ { script {{SCRIPT}}; proxy_pass http://up; }
        location /dead/ { script {{SCRIPT}}; proxy_pass http://dead; }
        location /never/ { script {{NEVER}}; proxy_pass http://up; }
        location /keep/ { script {{KEEPER}}; client_max_body_size 100; proxy_pass http://up; }
    }
}
]]

local ctx = H.context

-- The "script" object of the access log line of the request to path (the last one).
local function logged(gw, path)
    return H.wait_until(function()
        local entries = H.access_entries(gw, path)
        return entries[#entries] and entries[#entries].script
    end, 5)
end

describe("on_response on every answer", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("response")
        H.write_file(dir .. "/script.lua", SCRIPT)
        H.write_file(dir .. "/never.lua", NEVER)
        H.write_file(dir .. "/keeper.lua", KEEPER)
        gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { SCRIPT = dir .. "/script.lua", NEVER = dir .. "/never.lua", KEEPER = dir .. "/keeper.lua", STORE = dir .. "/idem.mdb", DEAD = H.dead_port() } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    it("edits the upstream's answer, as before", function()
        up:program({ default = { status = 200, headers = { ["X-Drop"] = "1", ["Content-Type"] = "text/html" },
            body = "page" } })
        local r = assert(H.request(gw.port, { method = "GET", path = "/s/page" }))
        assert.equal(200, r.status)
        assert.equal("page", r.body)
        assert.equal("1", r.headers["x-edited"])
        assert.equal("text/html", r.headers["x-type-was"])
        assert.equal("yes", r.headers["x-ctx"])
        assert.is_nil(r.headers["x-drop"])
    end)

    it("edits the gateway's 502 for a dead upstream", function()
        local r = assert(H.request(gw.port, { method = "GET", path = "/dead/x" }))
        assert.equal(502, r.status, ctx(gw))
        assert.equal("1", r.headers["x-edited"])
        assert.equal("502", r.headers["x-status-was"])
        assert.equal("text/plain", r.headers["x-type-was"])
        assert.equal("nil", r.headers["x-body-was"])
        assert.is_nil(r.headers["server"]) -- removed by the script
        assert.truthy(r.headers["date"])
        assert.equal(tostring(#r.body), r.headers["content-length"])
        assert.truthy(r.body:find("502", 1, true))
        assert.same({ edited = "1", server = "nil", why = "nil" }, logged(gw, "/dead/x"))
    end)

    it("edits a script's req:respond, and keeps a 204 without a body", function()
        local r = assert(H.request(gw.port, { method = "GET", path = "/s/deny" }))
        assert.equal(403, r.status)
        assert.equal("no", r.body)
        assert.equal("denied", r.headers["x-why"])
        assert.equal("denied", r.headers["x-why-was"])
        assert.equal("text/plain", r.headers["x-type-was"])
        assert.equal("1", r.headers["x-edited"])
        assert.same({ edited = "1", server = "nil", why = "denied" }, logged(gw, "/s/deny"))
        r = assert(H.request(gw.port, { method = "GET", path = "/s/empty" }))
        assert.equal(204, r.status)
        assert.equal("", r.body)
        assert.equal("1", r.headers["x-edited"])
        assert.equal("nil", r.headers["x-type-was"])
        assert.is_nil(r.headers["content-length"])
        -- the connection still frames the next answer right
        r = assert(H.request(gw.port, { method = "HEAD", path = "/s/deny" }))
        assert.equal(403, r.status)
        assert.equal("", r.body)
        assert.equal("2", r.headers["content-length"])
    end)

    it("edits a replay and a problem of the idempotency store, which keeps the upstream's answer", function()
        up:reset()
        up:program({ default = { status = 201, headers = { ["X-Drop"] = "upstream" }, body = "paid" } })
        local key = I.new_key("resp")
        local first = assert(I.post(gw.port, "/s/pay", key))
        assert.equal(201, first.status)
        assert.equal("1", first.headers["x-edited"])
        assert.equal("nil", first.headers["x-replayed-was"])
        local again = assert(I.repeat_post(gw.port, "/s/pay", key))
        assert.equal(201, again.status, ctx(gw))
        assert.equal("paid", again.body)
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal("true", again.headers["x-replayed-was"])
        assert.equal("1", again.headers["x-edited"])
        assert.is_nil(again.headers["x-drop"]) -- the stored answer had it; on_response removed it again
        assert.equal(1, #up:hits())
        -- a mismatched body is the store's 422 problem, edited too
        local bad = assert(I.post(gw.port, "/s/pay", key, '{"amount":99}'))
        assert.equal(422, bad.status)
        assert.equal("application/problem+json", bad.headers["x-type-was"])
        assert.equal("1", bad.headers["x-edited"])
    end)

    it("dedupes a GET its script says is not idempotent, by the same rule as retries", function()
        up:reset()
        up:program({ default = { status = 200, body = "once" } })
        local key = I.new_key("never")
        local function get()
            return H.request(gw.port, { method = "GET", path = "/never/x",
                headers = { { "Idempotency-Key", key } } })
        end
        local first = assert(get())
        assert.equal(200, first.status)
        local again
        H.wait_until(function()
            again = get()
            return again and again.status ~= 409
        end, 3)
        assert.equal(200, again.status, ctx(gw))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
    end)

    it("shows no other request's req to a hook, and frees what on_response made on a refused request", function()
        up:reset()
        up:program({ default = { status = 200, body = "ok" } })
        local r = assert(H.request(gw.port, { method = "PUT", path = "/keep/a?token=alice",
            headers = { { "X-Secret", "alice" } }, body = "x" }))
        assert.equal(200, r.status)
        assert.equal("/keep/a", r.headers["x-kept-path"])
        assert.equal("alice", r.headers["x-kept-secret"])
        -- refused before on_request's place (413): the kept req shows this request, not alice's
        for i = 1, 120 do
            r = assert(H.request(gw.port, { method = "POST", path = "/keep/big" .. i, body = ("b"):rep(500) }))
            assert.equal(413, r.status)
            assert.equal("/keep/big" .. i, r.headers["x-kept-path"], ctx(gw))
            assert.equal("POST", r.headers["x-kept-method"])
            assert.equal("nil", r.headers["x-kept-secret"], ctx(gw))
        end
        -- 120 tables of 200 KB made in on_response were each freed with their request: 16m was never reached
        assert.is_nil(gw:log():find("more memory than script_memory_max", 1, true), ctx(gw))
        assert.is_nil(gw:log():find("was made again", 1, true), ctx(gw))
    end)
end)
