-- Adaptive backoff (the default): while an upstream's retries succeed, a retry goes at once; as they fail the
-- waits grow back to the configured schedule; a budget that is draining means the whole schedule. Every spec runs
-- the real binary in front of tests/tools/fault_upstream.lua and reads what the access log says each retry waited,
-- and which regime chose it.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local json = require("cjson")

local ctx = H.context

local entries = H.entries

local function logged(gw, prefix, n)
    return H.wait_until(function() return #entries(gw, prefix) >= n or nil end, 10)
end

-- One request on a fresh connection (so two workers share them).
local function get(port, path)
    return H.request(port, { path = path, headers = { { "Connection", "close" } } })
end

local CONF = [[
worker_processes {{WORKERS}};
error_log logs/error.log info;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log {{PREFIX}}/logs/access.log;
    upstream one {
        server {{UPSTREAM}} max_fails=0;
        {{BUDGET}}
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 2;
        retry_backoff 300ms 300ms jitter=none {{ADAPTIVE}};
        location / { proxy_pass http://one; }
    }
}
]]

local function start(up, vars)
    local v = { WORKERS = "1", BUDGET = "retry_budget off;", ADAPTIVE = "" }
    for k, x in pairs(vars or {}) do v[k] = x end
    return H.start_gateway({ conf = CONF, upstream = up, vars = v })
end

describe("adaptive backoff", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
        gw, up = nil, nil
    end)

    it("retries at once while the upstream's retries succeed, where the schedule says 300 ms", function()
        gw = start(up)
        for i = 1, 10 do
            up:program({ routes = { ["/ok/" .. i] = { sequence = { 503 }, default = 200 } }, merge = true })
        end
        for i = 1, 10 do
            local r = get(gw.port, "/ok/" .. i)
            assert.equal(200, r and r.status, ctx(gw))
        end
        assert.truthy(logged(gw, "/ok/", 10), ctx(gw, "access log incomplete"))
        for _, e in ipairs(entries(gw, "/ok/")) do
            assert.equal(2, #e.attempts, json.encode(e))
            assert.equal("fast", e.attempts[2].regime, json.encode(e))
            assert.equal(0, e.attempts[2].wait, json.encode(e))
            assert.is_nil(e.attempts[1].regime) -- a first attempt waits for nothing
        end
    end)

    it("grows the waits back to the schedule as retries fail, and goes fast again once they work", function()
        gw = start(up)
        up:program({ default = { status = 503, body = "down\n" } })
        -- each request: one failed attempt, one failed retry; 40 of them take the regime to the schedule
        for i = 1, 40 do
            local r = get(gw.port, "/down/" .. i)
            assert.equal(503, r and r.status, ctx(gw))
        end
        assert.truthy(logged(gw, "/down/", 40), ctx(gw, "access log incomplete"))
        local seen, order = {}, {}
        for _, e in ipairs(entries(gw, "/down/")) do
            local a = e.attempts[2]
            assert.truthy(a, json.encode(e))
            if not seen[a.regime] then seen[a.regime] = true; order[#order + 1] = a.regime end
            if a.regime == "fast" then assert.equal(0, a.wait, json.encode(e)) end
            if a.regime == "scaled" then assert.is_true(a.wait > 0 and a.wait < 0.3, json.encode(e)) end
            if a.regime == "backoff" then assert.is_true(math.abs(a.wait - 0.3) < 0.0015, json.encode(e)) end
        end
        assert.same({ "fast", "scaled", "backoff" }, order, "regimes in order of appearance")
        local last = entries(gw, "/down/")
        assert.equal("backoff", last[#last].attempts[2].regime)
        -- retries that work again: each success moves the regime back, the waits shrink, then none
        up:program({ default = 200 })
        for i = 1, 40 do
            up:program({ routes = { ["/back/" .. i] = { sequence = { 503 }, default = 200 } }, merge = true })
        end
        for i = 1, 40 do
            local r = get(gw.port, "/back/" .. i)
            assert.equal(200, r and r.status, ctx(gw))
        end
        assert.truthy(logged(gw, "/back/", 40), ctx(gw, "access log incomplete"))
        local back = entries(gw, "/back/")
        assert.equal("fast", back[#back].attempts[2].regime, json.encode(back[#back]))
    end)

    it("waits the whole schedule once the adaptive budget has spent half of its first tokens", function()
        gw = start(up, { BUDGET = "" }) -- the default budget: starts with 10 tokens
        up:program({ default = { status = 503, body = "down\n" } })
        for i = 1, 8 do
            local r = get(gw.port, "/drain/" .. i)
            assert.equal(503, r and r.status, ctx(gw))
        end
        assert.truthy(logged(gw, "/drain/", 8), ctx(gw, "access log incomplete"))
        local es = entries(gw, "/drain/")
        -- 6 retries paid 6 tokens of 10: from the 7th on, the score alone would still say fast
        assert.equal("fast", es[1].attempts[2].regime, json.encode(es[1]))
        for i = 7, 8 do
            local a = es[i].attempts[2]
            assert.truthy(a, json.encode(es[i]))
            assert.equal("backoff", a.regime, json.encode(es[i]))
            assert.is_true(math.abs(a.wait - 0.3) < 0.0015, json.encode(es[i]))
        end
    end)

    it("waits the schedule after a 429 even while retries work (a rate limit is no passing fault)", function()
        gw = start(up)
        up:program({ routes = { ["/limited"] = { sequence = { 429 }, default = 200 },
                                ["/ok"] = { sequence = { 503 }, default = 200 } } })
        assert.equal(200, get(gw.port, "/ok").status)
        assert.equal(200, get(gw.port, "/limited").status)
        assert.truthy(logged(gw, "/limited", 1), ctx(gw, "access log incomplete"))
        assert.equal("fast", entries(gw, "/ok")[1].attempts[2].regime)
        local a = entries(gw, "/limited")[1].attempts[2]
        assert.equal("backoff", a.regime, json.encode(a))
        assert.is_true(math.abs(a.wait - 0.3) < 0.0015, json.encode(a))
    end)

    it("tells a route script's on_log the regime, the verdict and its reason", function()
        local dir = H.mkdtemp("onlog")
        H.write_file(dir .. "/log.lua", [=[
return {
    on_log = function(ctx)
        local a = ctx.attempts[2]
        ctx:set("regime", a and a.regime or "none")
        ctx:set("verdict", ctx.verdict or "none")
        ctx:set("reason", ctx.reason or "none")
    end,
}
]=])
        local conf = CONF:gsub("location / { proxy_pass http://one; }",
            "location / { script " .. dir .. "/log.lua; proxy_pass http://one; }")
        gw = H.start_gateway({ conf = conf, upstream = up,
            vars = { WORKERS = "1", BUDGET = "retry_budget off;", ADAPTIVE = "" } })
        up:program({ routes = { ["/told"] = { sequence = { 503 }, default = 200 } } })
        assert.equal(200, get(gw.port, "/told").status)
        assert.truthy(logged(gw, "/told", 1), ctx(gw, "access log incomplete"))
        local e = entries(gw, "/told")[1]
        assert.same({ regime = "fast", verdict = "passed", reason = "final_status" }, e.script, json.encode(e))
        H.rm_rf(dir)
    end)

    it("adaptive=off waits the schedule from the first retry", function()
        gw = start(up, { ADAPTIVE = "adaptive=off" })
        up:program({ routes = { ["/fixed"] = { sequence = { 503 }, default = 200 } } })
        local r = get(gw.port, "/fixed")
        assert.equal(200, r and r.status, ctx(gw))
        assert.truthy(logged(gw, "/fixed", 1), ctx(gw, "access log incomplete"))
        local a = entries(gw, "/fixed")[1].attempts[2]
        assert.equal("backoff", a.regime)
        assert.is_true(math.abs(a.wait - 0.3) < 0.0015, json.encode(a))
    end)

    it("is the upstream's, shared by two workers: failures through either slow both", function()
        gw = start(up, { WORKERS = "2" })
        up:program({ default = { status = 503, body = "down\n" } })
        -- 45 failed retries in all are past the slow bound (36 from the start); each worker's retries
        -- after that wait the schedule, whichever worker made the failures before
        local late = {}
        for round = 1, 8 do
            for i = 1, 20 do
                local r = get(gw.port, "/two/" .. round .. "/" .. i)
                assert.equal(503, r and r.status, ctx(gw))
            end
            assert.truthy(logged(gw, "/two/", round * 20), ctx(gw, "access log incomplete"))
            late = {}
            for k, e in ipairs(entries(gw, "/two/")) do
                if k > 45 then late[e.pid] = e end
            end
            local n = 0
            for _ in pairs(late) do n = n + 1 end
            if n == 2 then break end
        end
        local n = 0
        for pid, e in pairs(late) do
            n = n + 1
            assert.equal("backoff", e.attempts[2].regime, "worker " .. pid .. ": " .. json.encode(e))
        end
        assert.equal(2, n, "one worker took every request")
    end)

    it("is shown by ricochet plan, with both regimes", function()
        local dir = H.mkdtemp("plan")
        H.write_file(dir .. "/r.conf", "http { upstream u { server 127.0.0.1:9; } server { listen 127.0.0.1:1; "
            .. "location /a { proxy_pass http://u; } location /b { retry_backoff 1s 2s adaptive=off; "
            .. "proxy_pass http://u; } } }\n")
        local code, out = H.run({ H.bin(), "plan", "-p", dir, "-c", dir .. "/r.conf" })
        assert.equal(0, code, out)
        assert.truthy(out:find("jitter=full adaptive=on", 1, true), out)
        assert.truthy(out:find('a retry goes at once ("fast")', 1, true), out)
        assert.truthy(out:find('("backoff")', 1, true), out)
        assert.truthy(out:find("adaptive=off: every retry waits as listed below", 1, true), out)
        code, out = H.run({ H.bin(), "-t", "-p", dir, "-c", dir .. "/r.conf" })
        assert.equal(0, code, out)
        H.write_file(dir .. "/bad.conf", "http { server { listen 127.0.0.1:1; retry_backoff 1s 2s adaptive=maybe; "
            .. "} }\n")
        code, out = H.run({ H.bin(), "-t", "-p", dir, "-c", dir .. "/bad.conf" })
        assert.equal(1, code, out)
        assert.truthy(out:find('bad.conf:1: invalid "adaptive=maybe" in "retry_backoff"', 1, true), out)
        H.rm_rf(dir)
    end)
end)
