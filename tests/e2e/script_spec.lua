-- Route scripts end to end: the real binary with `script FILE;` in front of the fault upstream. Every spec checks
-- what the client got and what reached the upstream; scripts are written into the gateway's prefix at setup.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local function hv(hit, name)
    local v = H.hit_values(hit, name)
    return v[#v]
end

local ROUTE = [[
local route = {}

function route.on_request(req)
    req:set_header("X-Script", "on_request")
    if req.path == "/search" then req.idempotent = true end
    if req.path == "/never" then req.idempotent = false end
    local order = req:header("X-Order")
    if order then req:set_idempotency_key("order-" .. ricochet.sha256(order):sub(1, 16)) end
    local body = req:json()
    if body and body.order_id then req:set_idempotency_key("body-" .. body.order_id) end
    if req.path == "/teapot" then
        req:respond(418, { ["X-Why"] = "because", ["Content-Type"] = "text/tea" }, "short and stout\n")
    end
    if req.path == "/throw" then error("on purpose") end
    if req.path == "/loop" then while true do end end
    if req.path == "/digest" then req:respond(200, {}, ricochet.sha256("abc") .. " " .. ricochet.hmac_sha256("Jefe", "what do ya want for nothing?") .. " " .. ricochet.uuid()) end
end

function route.classify(res, attempt)
    if res == nil then return nil end
    if res.status == 200 and res:header("X-Error") == "overloaded" then return "retry" end
    local body = res:json()
    if res.status == 200 and type(body) == "table" and body.error == "overloaded" then return "retry" end
    if res.status == 409 then return "accept" end
    if res.status == 402 then return "fail" end
    if res.status == 503 and attempt.number == 1 and res:header("X-Later") then return "retry", 0.2 end
    if res.status == 418 then return "sideways" end
end

function route.on_log(ctx)
    ricochet.log("info", "on_log", ctx.path, ctx.status, #ctx.attempts)
end

return route
]]

-- A second script: what a script must not be able to do to the gateway or to other scripts.
local ROUTE2 = [[
local route = {}
local kept
function route.on_request(req)
    kept = req
    if req.path == "/two/catch" then
        pcall(function() while true do end end) -- the stop cannot be caught
        while true do end
    end
    if req.path == "/two/tamper" then
        require("cjson.safe").decode = function() return { hijacked = true } end
        ricochet.sha256 = function() return "forged" end
        string.upper = function() return "hijacked" end
    end
    if req.path == "/two/strip" then req:set_header("Idempotency-Key", nil) end
    if req.path == "/two/nocontent" then req:respond(204, {}, "") end
    if req.path == "/two/badnocontent" then req:respond(204, {}, "oops") end
end
function route.classify(res, attempt)
    if res and res.status == 299 then kept:set_idempotency_key("late") end
end
return route
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 1ms 2ms;
        location / {
            script {{SCRIPT}};
            idempotency_key on;
            classify_body_max 4k;
            proxy_pass http://up;
        }
        location /plain/ {
            proxy_pass http://up;
        }
        location /two/ {
            script {{SCRIPT2}};
            idempotency_key on;
            proxy_pass http://up;
        }
    }
}
]]

-- A directory of scripts for one spec file, removed at the end.
local lfs = require("lfs")
local sdir = os.tmpname()
os.remove(sdir)
assert(lfs.mkdir(sdir))
local function script(name, text)
    H.write_file(sdir .. "/" .. name, text)
    return sdir .. "/" .. name
end

describe("a route script", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = CONF, upstream = up,
            vars = { SCRIPT = script("route.lua", ROUTE), SCRIPT2 = script("route2.lua", ROUTE2) } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function() up:reset() end)

    it("retries a 200 that its classify calls overloaded", function()
        up:program({ sequence = { { status = 200, headers = { ["X-Error"] = "overloaded" }, body = "busy" } },
            default = { status = 200, body = "fine" } })
        local resp = assert(H.request(gw.port, { path = "/items" }))
        assert.equal(200, resp.status)
        assert.equal("fine", resp.body, ctx(gw))
        assert.equal(2, #up:hits())
    end)

    it("retries a 200 whose JSON body says overloaded (classify_body_max), chunked too", function()
        up:program({ sequence = { { status = 200, body = '{"error":"overloaded"}' } },
            default = { status = 200, body = '{"items":[]}' } })
        local resp = assert(H.request(gw.port, { path = "/body" }))
        assert.equal('{"items":[]}', resp.body, ctx(gw))
        assert.equal(2, #up:hits())
        up:reset()
        up:program({ sequence = { { status = 200, body = '{"error":"overloaded"}', chunked = true, chunk_size = 5 } },
            default = { status = 200, body = "fine", chunked = true } })
        resp = assert(H.request(gw.port, { path = "/chunked" }))
        assert.equal("fine", resp.body, ctx(gw))
        assert.equal(2, #up:hits())
    end)

    it("classifies a body larger than classify_body_max by its head, and passes it on whole", function()
        local big = '{"error":"overloaded","pad":"' .. ("x"):rep(8000) .. '"}'
        up:program({ default = { status = 200, body = big } })
        local resp = assert(H.request(gw.port, { path = "/big" }))
        assert.equal(200, resp.status)
        assert.equal(big, resp.body)
        assert.equal(1, #up:hits(), ctx(gw))
    end)

    it("retries a POST /search the script marks idempotent, and not a plain POST", function()
        up:program({ sequence = { 503 }, default = { status = 200, body = "found" } })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/search", body = "q=1" }))
        assert.equal(200, resp.status, ctx(gw))
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.equal("q=1", hits[2].body)
        up:reset()
        up:program({ sequence = { 503 }, default = 200 })
        resp = assert(H.request(gw.port, { method = "POST", path = "/other", body = "x" }))
        assert.equal(503, resp.status)
        assert.equal(1, #up:hits())
    end)

    it("never retries a request the script says is not idempotent, even a GET", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp = assert(H.request(gw.port, { path = "/never" }))
        assert.equal(503, resp.status)
        assert.equal(1, #up:hits())
    end)

    it("refuses its \"retry\" for a POST that is not replay-safe: one attempt, logged", function()
        up:program({ default = { status = 200, headers = { ["X-Error"] = "overloaded" }, body = "busy" } })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/pay", body = "{}" }))
        assert.equal(200, resp.status)
        assert.equal("busy", resp.body)
        assert.equal(1, #up:hits())
        assert.truthy(H.wait_until(function()
            return gw:log():find("asked to retry a request that is not replay-safe: refused", 1, true)
        end, 15), ctx(gw))
    end)

    it("sends a key derived in on_request with every attempt, and it makes the POST retryable", function()
        up:program({ sequence = { 503, 503 }, default = { status = 200, body = "paid" } })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/pay",
            headers = { { "Content-Type", "application/json" }, { "Idempotency-Key", "client-key" } },
            body = '{"order_id":"A-17","amount":5}' }))
        assert.equal(200, resp.status, ctx(gw))
        local hits = up:hits()
        assert.equal(3, #hits)
        for i = 1, 3 do
            assert.same({ "body-A-17" }, H.hit_values(hits[i], "Idempotency-Key"))
            assert.equal("on_request", hv(hits[i], "X-Script"))
        end
    end)

    it("makes \"fail\" final at once and \"accept\" keeps a status it would retry", function()
        up:program({ sequence = { 402 }, default = 200 })
        local resp = assert(H.request(gw.port, { path = "/charge" }))
        assert.equal(402, resp.status)
        assert.equal(1, #up:hits())
        up:reset()
        up:program({ default = 409 })
        resp = assert(H.request(gw.port, { path = "/dup" }))
        assert.equal(409, resp.status)
        assert.equal(1, #up:hits())
    end)

    it("waits the delay its \"retry\" names", function()
        up:program({ sequence = { { status = 503, headers = { ["X-Later"] = "1" } } }, default = 200 })
        local resp = assert(H.request(gw.port, { path = "/later" }))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.is_true(hits[2].time - hits[1].time >= 0.19, "waited " .. (hits[2].time - hits[1].time))
    end)

    it("answers with req:respond and never touches the upstream", function()
        local resp = assert(H.request(gw.port, { path = "/teapot" }))
        assert.equal(418, resp.status)
        assert.equal("short and stout\n", resp.body)
        assert.equal("because", resp.headers["x-why"])
        assert.equal("text/tea", resp.headers["content-type"])
        assert.equal(0, #up:hits())
    end)

    it("falls back to the built-in policy when a hook throws, naming FILE:LINE", function()
        up:program({ sequence = { 503 }, default = { status = 200, body = "ok" } })
        local resp = assert(H.request(gw.port, { path = "/throw" }))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits) -- a GET: retried by the built-in policy
        assert.is_nil(hv(hits[1], "X-Script"), "edits of a failed on_request were kept")
        assert.truthy(H.wait_until(function()
            return gw:log():find("route.lua:14: on purpose", 1, true)
        end, 15), ctx(gw))
    end)

    it("stops a hook that never returns, and serves the request", function()
        local resp = assert(H.request(gw.port, { path = "/loop", timeout = 10 }))
        assert.equal(200, resp.status)
        assert.truthy(gw:log():find("stopped: it ran longer than a hook may", 1, true), ctx(gw))
    end)

    it("logs a verdict it does not know and lets the built-in policy decide", function()
        up:program({ default = 418 })
        local resp = assert(H.request(gw.port, { path = "/odd" }))
        assert.equal(418, resp.status)
        assert.truthy(H.wait_until(function()
            return gw:log():find("route.lua:19: classify returned \"sideways\"", 1, true)
        end, 15), ctx(gw))
    end)

    it("calls on_log after the exchange", function()
        up:program({ default = 200 })
        assert(H.request(gw.port, { path = "/logged" }))
        assert.truthy(H.wait_until(function()
            return gw:log():find("route.lua:31: on_log /logged 200 1", 1, true)
        end, 15), ctx(gw))
    end)

    it("computes digests as the test kit does (OpenSSL), and UUIDs", function()
        local resp = assert(H.request(gw.port, { path = "/digest" }))
        local sha, mac, id = resp.body:match("^(%x+) (%x+) (%S+)$")
        assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", sha)
        assert.equal("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", mac)
        assert.truthy(id:match("^%x+%-%x+%-4%x+%-[89ab]%x+%-%x+$"), id)
    end)

    it("stops a hook that catches its stop with pcall", function()
        local resp = assert(H.request(gw.port, { path = "/two/catch", timeout = 10 }))
        assert.equal(200, resp.status, ctx(gw))
    end)

    it("keeps one script's changes to libraries away from the gateway and other scripts", function()
        assert(H.request(gw.port, { path = "/two/tamper" }))
        local resp = assert(H.request(gw.port, { method = "POST", path = "/pay",
            body = '{"order_id":"Z"}' }))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.same({ "body-Z" }, H.hit_values(hits[#hits], "Idempotency-Key"))
        resp = assert(H.request(gw.port, { path = "/digest" }))
        assert.truthy(resp.body:find("^ba7816bf"), resp.body)
    end)

    it("follows a key field removed with set_header: the POST is not replay-safe", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/two/strip",
            headers = { { "Idempotency-Key", "client" } }, body = "x" }))
        assert.equal(503, resp.status)
        local hits = up:hits()
        assert.equal(1, #hits)
        assert.same({}, H.hit_values(hits[1], "Idempotency-Key"))
    end)

    it("lets req change only in on_request: a kept req used in classify is an error", function()
        up:program({ default = 299 })
        local resp = assert(H.request(gw.port, { path = "/two/late" }))
        assert.equal(299, resp.status)
        assert.truthy(H.wait_until(function()
            return gw:log():find("req:set_idempotency_key can only be called in on_request", 1, true)
        end, 15), ctx(gw))
    end)

    it("answers a 204 without a body or a length, and refuses a 204 with a body", function()
        local resp = assert(H.request(gw.port, { path = "/two/nocontent" }))
        assert.equal(204, resp.status)
        assert.is_nil(resp.headers["content-length"])
        up:program({ default = 200 })
        resp = assert(H.request(gw.port, { path = "/two/badnocontent" }))
        assert.equal(200, resp.status) -- on_request failed: the upstream answered
        -- the error names the script's line, not the library's
        assert.truthy(gw:log():find("route2%.lua:%d+: req:respond: a 204 has no body"), ctx(gw))
    end)

    it("leaves routes without a script alone", function()
        up:program({ default = 200 })
        assert(H.request(gw.port, { path = "/plain/x" }))
        assert.is_nil(hv(up:hits()[1], "X-Script"))
    end)
end)

describe("the script sandbox", function()
    teardown(function() os.execute("rm -rf '" .. sdir .. "'") end)

    local function check(name, body, want)
        local path = script(name, body)
        H.write_file(sdir .. "/" .. name .. ".conf", ("http { server { listen 127.0.0.1:1; location / { "
            .. "script %s; proxy_pass http://127.0.0.1:9; } } }\n"):format(path))
        local code, out = H.run({ H.bin(), "-t", "-c", sdir .. "/" .. name .. ".conf" })
        assert.equal(1, code, out)
        assert.truthy(out:find(want, 1, true), out)
        return out
    end

    it("refuses os.execute, io.open, loadfile, dofile and the ffi", function()
        check("exec.lua", "os.execute('true')\nreturn {}\n", "exec.lua:1: attempt to call field 'execute'")
        check("io.lua", "local f = io.open('/etc/passwd')\nreturn {}\n", "io.lua:1: attempt to index global 'io'")
        check("lf.lua", "loadfile('/x')\nreturn {}\n", "lf.lua:1: attempt to call global 'loadfile'")
        check("df.lua", "dofile('/x')\nreturn {}\n", "df.lua:1: attempt to call global 'dofile'")
        check("useffi.lua", "local ffi = require('ffi')\nreturn {}\n", 'module "ffi" not found')
        check("exit.lua", "os.exit(1)\nreturn {}\n", "exit.lua:1: attempt to call field 'exit'")
    end)

    it("refuses bytecode, a syntax error with FILE:LINE, and a script that returns no hooks", function()
        check("syntax.lua", "local x = = 1\n", "syntax.lua:1: unexpected symbol near '='")
        check("bad.lua", "return { on_request = 1 }\n", "route.on_request must be a function")
        check("none.lua", "return 42\n", "must return a table of hooks")
        check("typo.lua", "return { on_requets = function() end }\n", '"on_requets", which is no hook')
        H.write_file(sdir .. "/bc.lua", "\27LJ\2junk")
        check("bc2.lua", "return require('bc')\n", "precompiled bytecode is not loaded")
    end)

    it("requires modules from the script's directory only", function()
        script("helper.lua", "return { answer = 42 }\n")
        local path = script("uses.lua", "local h = require('helper')\nassert(h.answer == 42)\n"
            .. "local cjson = require('cjson')\nreturn {}\n")
        H.write_file(sdir .. "/uses.conf", ("http { server { listen 127.0.0.1:1; location / { "
            .. "script %s; proxy_pass http://127.0.0.1:9; } } }\n"):format(path))
        local code, out = H.run({ H.bin(), "-t", "-c", sdir .. "/uses.conf" })
        assert.equal(0, code, out)
        check("up.lua", "require('..etc')\nreturn {}\n", "invalid module name")
    end)

    it("stops a script whose main chunk never ends", function()
        check("forever.lua", "while true do end\n", "stopped: it ran longer than a hook may")
    end)
end)

local EXAMPLES = [[
worker_processes 1;
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 1ms 2ms;
        location /pay { script {{ROOT}}/scripts/examples/payments.lua; idempotency_key on; proxy_pass http://up; }
        location /search { script {{ROOT}}/scripts/examples/search.lua; proxy_pass http://up; }
        location /limited { script {{ROOT}}/scripts/examples/rate_limited.lua; proxy_pass http://up; }
        location /busy { script {{ROOT}}/scripts/examples/overloaded.lua; classify_body_max 1k; proxy_pass http://up; }
    }
}
]]

describe("the example scripts, in the gateway", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = EXAMPLES, upstream = up, vars = { ROOT = H.root } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function() up:reset() end)

    it("payments.lua: one key per order on every attempt; 402 final; 409 accepted", function()
        up:program({ sequence = { 503 }, default = { status = 200, body = "paid" } })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/pay",
            headers = { { "Content-Type", "application/json" } }, body = '{"order_id":"A-17"}' }))
        assert.equal(200, resp.status, ctx(gw))
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.truthy(hv(hits[1], "Idempotency-Key"):match("^order%-%x+$"))
        assert.equal(hv(hits[1], "Idempotency-Key"), hv(hits[2], "Idempotency-Key"))
        up:reset()
        up:program({ default = 402 })
        resp = assert(H.request(gw.port, { method = "POST", path = "/pay", body = '{"order_id":"B"}' }))
        assert.equal(402, resp.status)
        assert.equal(1, #up:hits())
        up:reset()
        up:program({ default = 409 })
        resp = assert(H.request(gw.port, { method = "POST", path = "/pay", body = '{"order_id":"C"}' }))
        assert.equal(409, resp.status)
        assert.equal(1, #up:hits())
        resp = assert(H.request(gw.port, { method = "POST", path = "/pay", body = '{}' }))
        assert.equal(400, resp.status)
        assert.equal(1, #up:hits())
    end)

    it("search.lua: a POST /search is retried like a GET", function()
        up:program({ sequence = { 503 }, default = { status = 200, body = "found" } })
        local resp = assert(H.request(gw.port, { method = "POST", path = "/search", body = "q=shoes" }))
        assert.equal(200, resp.status)
        assert.equal(2, #up:hits())
    end)

    it("overloaded.lua: a 200 that says overloaded is retried", function()
        up:program({ sequence = { { status = 200, body = '{"error":"overloaded"}' } },
            default = { status = 200, body = '{"ok":true}' } })
        local resp = assert(H.request(gw.port, { path = "/busy" }))
        assert.equal('{"ok":true}', resp.body)
        assert.equal(2, #up:hits())
    end)

    it("rate_limited.lua: a 429 is retried after its Retry-After", function()
        up:program({ sequence = { { status = 429, headers = { ["Retry-After"] = "1" } } }, default = 200 })
        local resp = assert(H.request(gw.port, { path = "/limited", timeout = 10 }))
        assert.equal(200, resp.status, ctx(gw))
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.is_true(hits[2].time - hits[1].time >= 0.9, "waited " .. (hits[2].time - hits[1].time))
    end)
end)
