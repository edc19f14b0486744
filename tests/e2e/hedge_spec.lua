-- Hedged requests (retry_hedge): for a replay-safe request whose first attempt has no answer after a while, a
-- second attempt goes out; the first answer that is not a failure wins and the other is cancelled, its connection
-- closed. Every spec runs the real binary in front of tests/tools/fault_upstream.lua and reads what happened in the
-- answer's body (which attempt's it is), the upstream's hits and the access log; none depends on how long
-- anything took. Every delay the upstream is told to wait is 10 to 300 times retry_hedge (100 ms), so which
-- attempt answers first is decided by the program, not by how busy the machine is.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local json = require("cjson")

local ctx = H.context

local function logged(gw, prefix, n)
    return H.wait_until(function() return #H.entries(gw, prefix) >= n or nil end, 10)
end

local function one(gw, path)
    assert.truthy(logged(gw, path, 1), ctx(gw, "no access log line for " .. path))
    return H.entries(gw, path)[1]
end

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log {{PREFIX}}/logs/access.log;
    admin_listen 127.0.0.1:{{PORT2}};
    upstream one {
        server {{UPSTREAM1}} max_fails=0;
        {{SECOND}}
        {{BUDGET}}
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts {{ATTEMPTS}};
        retry_hedge {{HEDGE}};
        idempotency_key on;
        client_body_buffer_size 16k;
        retry_body_max 16k;
        {{EXTRA}}
        location / { proxy_pass http://one; }
    }
}
]]

local function start(ups, vars)
    local v = { HEDGE = "100ms", ATTEMPTS = "3", BUDGET = "retry_budget off;", SECOND = "", EXTRA = "" }
    if ups[2] then v.SECOND = "server {{UPSTREAM2}} max_fails=0;" end
    for k, x in pairs(vars or {}) do v[k] = x end
    v.SECOND = v.SECOND:gsub("{{UPSTREAM2}}", ups[2] and ups[2].addr or "")
    return H.start_gateway({ conf = CONF, upstreams = ups, vars = v })
end

local function get(port, path, headers)
    local hs = { { "Connection", "close" } }
    for _, h in ipairs(headers or {}) do hs[#hs + 1] = h end
    return H.request(port, { path = path, headers = hs, timeout = 15 })
end

local function slow(ms, body, status)
    return { status = status or 200, delay_ms = ms, body = body }
end

local function metric(gw, route, outcome)
    local r = H.request(gw.port2, { path = "/metrics", headers = { { "Connection", "close" } } })
    assert(r and r.status == 200, ctx(gw, "GET /metrics"))
    local pat = 'ricochet_hedges_total{route="' .. route:gsub("%p", "%%%0") .. '",outcome="' .. outcome .. '"} (%d+)'
    return tonumber(r.body:match(pat))
end

describe("retry_hedge", function()
    local up, up2, gw

    before_each(function()
        up = H.start_upstream()
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if up2 then up2:stop() end
        gw, up, up2 = nil, nil, nil
    end)

    it("sends a hedge when the first attempt is slow, passes on the hedge's answer and closes the first", function()
        gw = start({ up })
        up:program({ routes = { ["/h"] = { sequence = { slow(10000, "first\n"), { status = 200, body = "hedge\n" } } },
                                ["/next"] = { default = { status = 200, body = "next\n" } } } })
        local r = get(gw.port, "/h")
        assert.equal(200, r and r.status, ctx(gw))
        assert.equal("hedge\n", r.body, ctx(gw))
        local e = one(gw, "/h")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal("cancelled", e.attempts[1].class, json.encode(e))
        assert.equal(json.null, e.attempts[1].status, json.encode(e))
        assert.equal(200, e.attempts[2].status, json.encode(e))
        assert.is_true(e.attempts[2].hedge, json.encode(e))
        assert.is_nil(e.attempts[1].hedge, json.encode(e))
        assert.is_nil(e.attempts[2].regime, json.encode(e)) -- a hedge is no retry: no backoff regime
        assert.equal("won", e.hedge, json.encode(e))
        assert.equal("passed", e.verdict, json.encode(e))
        -- the hedge's wait is how long after the first it went: about retry_hedge, never before it
        assert.is_true(e.attempts[2].wait >= 0.1, json.encode(e))
        -- both were sent, with their own attempt numbers
        local hits = up:wait_hits(2)
        assert.equal(2, #hits)
        assert.same({ "1" }, H.hit_values(hits[1], "x-ricochet-attempt"))
        assert.same({ "2" }, H.hit_values(hits[2], "x-ricochet-attempt"))
        -- the slow first attempt's connection was closed, not pooled half-read: the next request does not get
        -- its late answer
        local n = get(gw.port, "/next")
        assert.equal("next\n", n and n.body, ctx(gw))
        assert.equal(1, metric(gw, "127.0.0.1:" .. gw.port .. " /", "won"))
    end)

    it("keeps the first attempt's answer when it comes first, and cancels the hedge", function()
        gw = start({ up })
        up:program({ routes = { ["/f"] = { sequence = { slow(3000, "first\n"), slow(30000, "hedge\n") } },
                                ["/after"] = { default = { status = 200, body = "after\n" } } } })
        local r = get(gw.port, "/f")
        assert.equal("first\n", r and r.body, ctx(gw))
        local e = one(gw, "/f")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal("cancelled", e.attempts[1].class, json.encode(e))
        assert.is_true(e.attempts[1].hedge, json.encode(e))
        assert.equal(200, e.attempts[2].status, json.encode(e))
        assert.equal("lost", e.hedge, json.encode(e))
        -- the upstream of the cancelled hedge never answers anyone
        for i = 1, 3 do
            local a = get(gw.port, "/after")
            assert.equal("after\n", a and a.body, ctx(gw, "request " .. i))
        end
        assert.equal(1, metric(gw, "127.0.0.1:" .. gw.port .. " /", "lost"))
    end)

    it("sends the hedge to another server of the upstream when it has one", function()
        up2 = H.start_upstream()
        gw = start({ up, up2 })
        up:program({ default = slow(3000, "one\n") })
        up2:program({ default = slow(3000, "two\n") })
        -- round robin starts on either server; the hedge goes to the other one
        local r = get(gw.port, "/other")
        assert.equal(200, r and r.status, ctx(gw))
        local e = one(gw, "/other")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.are_not.equal(e.attempts[1].server, e.attempts[2].server, json.encode(e))
        assert.equal(1, up:stats().hits, "one attempt on each server")
        assert.equal(1, up2:stats().hits, "one attempt on each server")
    end)

    it("sends at most one hedge a request, however slow both are", function()
        gw = start({ up }, { ATTEMPTS = "5" })
        up:program({ routes = { ["/both"] = { sequence = { slow(3000, "first\n"), slow(30000, "hedge\n") } } } })
        local r = get(gw.port, "/both")
        assert.equal("first\n", r and r.body, ctx(gw))
        local e = one(gw, "/both")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal(2, up:stats().hits)
    end)

    it("lets the other attempt go on when one of the pair fails, and retries only when both did", function()
        gw = start({ up })
        -- the hedge fails fast while the first is still out: the first's answer is passed on
        up:program({ routes = {
            ["/hf"] = { sequence = { slow(2000, "first\n"), { status = 503, body = "busy\n" } } },
            ["/bf"] = { sequence = { slow(2000, "first busy\n", 503), { status = 503, body = "hedge busy\n" } },
                        default = { status = 200, body = "third\n" } },
        } })
        local r = get(gw.port, "/hf")
        assert.equal("first\n", r and r.body, ctx(gw))
        local e = one(gw, "/hf")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal(503, e.attempts[1].status, json.encode(e))
        assert.is_true(e.attempts[1].hedge, json.encode(e))
        assert.equal(200, e.attempts[2].status, json.encode(e))
        assert.equal("failed", e.hedge, json.encode(e))
        -- both fail: then the retry policy takes over, with a third attempt (not another hedge)
        r = get(gw.port, "/bf")
        assert.equal("third\n", r and r.body, ctx(gw))
        e = one(gw, "/bf")
        assert.equal(3, #e.attempts, json.encode(e))
        assert.equal(503, e.attempts[1].status, json.encode(e))
        assert.equal(503, e.attempts[2].status, json.encode(e))
        assert.equal(200, e.attempts[3].status, json.encode(e))
        assert.is_nil(e.attempts[3].hedge, json.encode(e))
        assert.truthy(e.attempts[3].regime, json.encode(e))
        assert.equal(5, up:stats().hits, "2 for /hf, 3 for /bf")
    end)

    it("never hedges what it could not retry: an unsafe method without a key, a body not held, retries off", function()
        gw = start({ up }, { EXTRA = "location /off { retries off; proxy_pass http://one; }" })
        up:program({ default = slow(1000, "slow\n") })
        local r = H.request(gw.port, { method = "POST", path = "/pay", body = "amount=1",
            headers = { { "Connection", "close" } }, timeout = 10 })
        assert.equal("slow\n", r and r.body, ctx(gw))
        -- a streamed body (larger than client_body_buffer_size and retry_body_max) is not held for replay
        local big = H.body_of_size(64 * 1024)
        r = H.request(gw.port, { method = "PUT", path = "/big", body = big,
            headers = { { "Connection", "close" } }, timeout = 10 })
        assert.equal("slow\n", r and r.body, ctx(gw))
        r = get(gw.port, "/off/x")
        assert.equal("slow\n", r and r.body, ctx(gw))
        assert.truthy(logged(gw, "/", 3), ctx(gw))
        for _, e in ipairs(H.entries(gw, "/")) do
            assert.equal(1, #e.attempts, json.encode(e))
            assert.is_nil(e.hedge, json.encode(e))
        end
        assert.equal(3, up:stats().hits)
    end)

    it("hedges a keyed POST with its body replayed byte for byte and the same key", function()
        gw = start({ up })
        up:program({ routes = { ["/charge"] = { sequence = { slow(10000, "first\n"),
                                                             { status = 201, body = "charged\n" } } } } })
        local body = H.text_body(5000, 7)
        local r = H.request(gw.port, { method = "POST", path = "/charge", body = body, timeout = 10,
            headers = { { "Connection", "close" }, { "Idempotency-Key", "k-123" } } })
        assert.equal(201, r and r.status, ctx(gw))
        assert.equal("charged\n", r.body)
        local hits = up:wait_hits(2)
        assert.equal(2, #hits)
        for _, h in ipairs(hits) do
            assert.equal(body, h.body)
            assert.same({ "k-123" }, H.hit_values(h, "idempotency-key"))
        end
        assert.equal("won", one(gw, "/charge").hedge)
    end)

    it("does not hedge when the retry budget cannot pay, and counts the refusal", function()
        gw = start({ up }, { BUDGET = "retry_budget 0% min=0/s;" })
        up:program({ default = slow(2000, "slow\n") })
        local r = get(gw.port, "/poor")
        assert.equal("slow\n", r and r.body, ctx(gw))
        local e = one(gw, "/poor")
        assert.equal(1, #e.attempts, json.encode(e))
        assert.is_nil(e.hedge, json.encode(e))
        assert.equal(1, up:stats().hits)
        assert.equal(1, metric(gw, "127.0.0.1:" .. gw.port .. " /", "refused"))
        assert.truthy(gw:log():find("refused a hedge", 1, true), ctx(gw))
    end)

    it("auto: waits for the upstream's p95, then hedges what is slower than it", function()
        gw = start({ up }, { HEDGE = "auto" })
        up:program({ routes = { ["/early"] = { default = slow(300, "early\n") },
                                ["/late"] = { sequence = { slow(30000, "first\n"), { status = 200, body = "hedge\n" } } } },
                     default = 200 })
        -- no estimate yet: a slow answer is waited for
        local r = get(gw.port, "/early")
        assert.equal("early\n", r and r.body, ctx(gw))
        assert.is_nil(one(gw, "/early").hedge)
        -- 60 fast answers make a p95 of a few milliseconds at most
        for i = 1, 60 do
            r = get(gw.port, "/fast/" .. i)
            assert.equal(200, r and r.status, ctx(gw))
        end
        r = get(gw.port, "/late")
        assert.equal("hedge\n", r and r.body, ctx(gw))
        local e = one(gw, "/late")
        assert.equal("won", e.hedge, json.encode(e))
        -- at the estimate (a few ms, however busy the machine: far below the first's 30 s), not at a fixed wait
        assert.is_true(e.attempts[2].wait < 3, json.encode(e))
    end)

    it("cuts both attempts when the client leaves, and keeps serving", function()
        gw = start({ up })
        up:program({ routes = { ["/gone"] = { default = slow(30000, "late\n") } }, default = 200 })
        local c = assert(H.connect(gw.port))
        assert(c:send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert.equal(2, #up:wait_hits(2, 20), ctx(gw, "the hedge was not sent"))
        c:close()
        local e
        H.wait_until(function() e = H.entries(gw, "/gone")[1]; return e end, 10)
        assert.truthy(e, ctx(gw, "no log line for the abandoned request"))
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal("client_closed", e.attempts[1].class, json.encode(e))
        assert.equal("client_closed", e.attempts[2].class, json.encode(e))
        assert.equal("lost", e.hedge, json.encode(e))
        assert.equal(200, get(gw.port, "/still").status, ctx(gw))
    end)

    it("gives on_log each attempt's hedge mark and the hedge's outcome", function()
        local dir = H.mkdtemp("hedgelog")
        local script = dir .. "/log.lua"
        H.write_file(script, [=[
return {
    on_log = function(ctx)
        local marks = {}
        for i, a in ipairs(ctx.attempts) do marks[i] = (a.hedge and "h" or "-") .. a.class end
        ctx:set("marks", table.concat(marks, ","))
        ctx:set("outcome", ctx.hedge or "none")
    end,
}
]=])
        gw = start({ up }, { EXTRA = "location /s { script " .. script .. "; proxy_pass http://one; }" })
        up:program({ routes = { ["/s"] = { sequence = { slow(10000, "first\n"), { status = 200, body = "hedge\n" } } } } })
        local r = get(gw.port, "/s")
        assert.equal("hedge\n", r and r.body, ctx(gw))
        local e = one(gw, "/s")
        assert.equal("-cancelled,hstatus", e.script.marks, json.encode(e))
        assert.equal("won", e.script.outcome, json.encode(e))
        H.rm_rf(dir)
    end)
end)

describe("retry_hedge in the config", function()
    local function check(body)
        local dir = H.mkdtemp("hedgeconf")
        local path = dir .. "/bad.conf"
        H.write_file(path, "http {\n    upstream u { server 127.0.0.1:1; }\n    server {\n        listen 127.0.0.1:1;\n"
            .. body .. "\n        location / { proxy_pass http://u; }\n    }\n}\n")
        local code, out = H.run({ H.bin(), "-t", "-p", dir, "-c", path })
        H.rm_rf(dir)
        return code, out, path
    end

    it("refuses a zero, a word it does not know and a hedge that could never be sent, with file:line", function()
        for _, case in ipairs({
            { "        retry_hedge 0;", ":5: invalid value \"0\" in \"retry_hedge\"" },
            { "        retry_hedge soon;", ":5: invalid value \"soon\" in \"retry_hedge\"" },
            { "        retry_hedge 50ms 1s;", ":5:" },
            { "        per_try_timeout 1s;\n        retry_hedge 2s;", "retry_hedge (2000ms) is not below per_try_timeout" },
        }) do
            local code, out, path = check(case[1])
            assert.are_not.equal(0, code, out)
            assert.truthy(out:find(case[2], 1, true), out)
            assert.truthy(out:find(path, 1, true), out)
        end
        local code, out = check("        retry_hedge auto;")
        assert.equal(0, code, out)
        code, out = check("        retry_hedge 30ms;")
        assert.equal(0, code, out)
    end)
end)
