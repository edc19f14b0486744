-- The retry budget and passive health across workers: two workers share one budget per upstream and one health
-- state per server, through the shared memory zone the master maps before it forks; a replaced worker keeps them.
-- Every spec runs the real binary with worker_processes 2 in front of tests/tools/fault_upstream.lua, and checks
-- what the clients got AND what reached the upstream.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local json = require("cjson")
local socket = require("socket")

local ctx = H.context

-- Access log entries (decoded), in order.
local access_entries = H.access_entries

-- Requests served per worker pid, counting entries whose path starts with prefix.
local function by_worker(gw, prefix)
    local n, pids = {}, 0
    for _, e in ipairs(access_entries(gw)) do
        if e.path:sub(1, #prefix) == prefix then
            local pid = tostring(e.pid)
            if not n[pid] then pids = pids + 1 end
            n[pid] = (n[pid] or 0) + 1
        end
    end
    return n, pids
end

-- Sends the requests of paths, each on a fresh connection (so the kernel hands them to either worker), in waves
-- of `width`; returns the responses (false for failures) and the first error.
local function burst(port, paths, width)
    local reqs = {}
    for i, p in ipairs(paths) do reqs[i] = { path = p } end
    return H.fire(port, reqs, width)
end

-- Paths /prefix/1 .. /prefix/n.
local function paths(prefix, n)
    local p = {}
    for i = 1, n do p[i] = prefix .. i end
    return p
end

-- Waits (bounded) until the access log holds n entries under prefix.
local function logged(gw, prefix, n)
    return H.wait_until(function()
        local per, _ = by_worker(gw, prefix)
        local total = 0
        for _, k in pairs(per) do total = total + k end
        if total >= n then return true end
    end, 15)
end

local SHARED = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream flaky {
        server {{UPSTREAM}};
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 4;
        retry_backoff 1ms 2ms;
        location / {
            proxy_pass http://flaky;
        }
    }
}
]]

describe("the default retry budget, shared by two workers", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = SHARED, upstream = up })
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("bounds an outage by one budget for the upstream, not one per worker", function()
        up:program({ default = { status = 503, body = "down\n" } })
        -- which worker accepts is the kernel's choice: bursts of 80 (at most 5) until both took enough requests
        -- that two budgets of their own would have paid 20 retries
        local n, per, pids = 0, {}, 0
        for round = 1, 5 do
            local resps, err = burst(gw.port, paths("/outage/" .. round .. "/", 80), 8)
            local got503 = 0
            for i = 1, 80 do
                if resps[i] and resps[i].status == 503 and resps[i].body == "down\n" then got503 = got503 + 1 end
            end
            assert.equal(80, got503, ctx(gw, err))
            n = n + 80
            assert.truthy(logged(gw, "/outage/", n), ctx(gw, "access log incomplete"))
            per, pids = by_worker(gw, "/outage/")
            local fewest = math.huge
            for _, k in pairs(per) do fewest = math.min(fewest, k) end
            if pids == 2 and fewest >= 11 then break end
        end
        assert.equal(2, pids, "all requests went to one worker: " .. json.encode(per))
        for pid, k in pairs(per) do
            assert.is_true(k >= 11, ("worker %s served only %d requests: %s"):format(pid, k, json.encode(per)))
        end
        -- a cold budget pays for 10 failing retries in all; without one: 4 attempts each
        local hits = up:stats().hits
        assert.is_true(hits >= n + 1, "no retry at all: " .. hits)
        assert.is_true(hits <= n + 10, ("%d upstream attempts for %d requests: more than one budget"):format(hits, n))
        -- the refusals say why
        local refused = 0
        for _, e in ipairs(access_entries(gw)) do
            if e.not_retried == "budget" then refused = refused + 1 end
        end
        assert.is_true(refused >= n - 10, "not_retried=budget on " .. refused .. " lines")
        assert.truthy(gw:log():find('passing on 503 from upstream after 1 attempt (budget)', 1, true), ctx(gw))
    end)

    it("retries through 30% random 503s: every request answered 200", function()
        -- 3 answers in 10 fail, never two in a row: one request at a time, each retry succeeds
        up:program({ sequence = { 503, 200, 200, 503, 200, 200, 200, 503, 200, 200 }, cycle = true })
        local conns = {}
        for i = 1, 4 do conns[i] = assert(H.connect(gw.port)) end
        local n, ok = 1000, 0
        for i = 1, n do
            local resp, err = H.request(gw.port, { path = "/random/" .. i, conn = conns[i % 4 + 1] })
            assert.truthy(resp, ctx(gw, ("request %d: %s"):format(i, tostring(err))))
            if resp.status == 200 then ok = ok + 1 end
        end
        for _, c in ipairs(conns) do c:close() end
        assert.equal(n, ok, ctx(gw, ("%d of %d got 200"):format(ok, n)))
        local hits = up:stats().hits
        -- 30% of attempts failed: 1000 requests took ~1428 attempts (a 20% ratio would have refused ~100 retries)
        assert.is_true(hits >= 1400 and hits <= 1460, "upstream attempts: " .. hits)
    end)
end)

local TWO_SERVERS = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream pair {
        server {{UPSTREAM1}} max_fails=1 fail_timeout=60s;
        server {{UPSTREAM2}} max_fails=1 fail_timeout=60s;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 2;
        retry_backoff 1ms 2ms;
        location / {
            proxy_pass http://pair;
        }
    }
}
]]

describe("passive health, shared by two workers", function()
    local bad, good, gw

    setup(function()
        bad = H.start_upstream()
        good = H.start_upstream()
        gw = H.start_gateway({ conf = TWO_SERVERS, upstreams = { bad, good } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if bad then bad:stop() end
        if good then good:stop() end
    end)

    it("skips a server in every worker once one worker marked it down", function()
        bad:program({ default = { status = 502, body = "bad\n" } })
        -- round robin reaches the bad server within two requests: it answers 502, is marked down and the
        -- request is retried on the good one
        local marked
        for i = 1, 4 do
            local resp, err = H.request(gw.port, { path = "/first/" .. i, headers = { { "Connection", "close" } } })
            assert.truthy(resp, ctx(gw, err))
            assert.equal(200, resp.status, ctx(gw))
            if bad:stats().hits > 0 then marked = i break end
        end
        assert.truthy(marked, ctx(gw, "the bad server never got a request"))
        assert.equal(1, bad:stats().hits)
        assert.truthy(H.wait_until(function() return gw:log():find("marked down", 1, true) end, 10), ctx(gw))
        -- now many requests on fresh connections, taken by both workers: none reaches the bad server
        -- (a busy machine may let one worker take a whole burst: bursts go on, a bounded number, until
        -- both have taken requests)
        local n, per, pids = 40, nil, 0
        for round = 1, 10 do
            local resps, err = burst(gw.port, paths("/after/" .. round .. "/", n), 4)
            for i = 1, n do
                assert.truthy(resps[i], ctx(gw, err))
                assert.equal(200, resps[i].status)
            end
            assert.truthy(logged(gw, "/after/", n * round), ctx(gw, "access log incomplete"))
            per, pids = by_worker(gw, "/after/")
            if pids == 2 then break end
        end
        assert.equal(2, pids, "all requests went to one worker: " .. json.encode(per))
        assert.equal(1, bad:stats().hits, "a worker that did not see the failure still sent to the bad server")
        for _, e in ipairs(access_entries(gw)) do
            if e.path:find("^/after/") then assert.equal(1, #e.attempts) end
        end
    end)
end)

describe("the shared state when a worker is killed", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = SHARED, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("survives: a worker started after a SIGKILL finds the budget as it was", function()
        up:program({ default = { status = 503, body = "down\n" } })
        -- drain the cold budget: 10 failing retries
        local resps = burst(gw.port, paths("/drain/", 30), 6)
        for i = 1, 30 do assert.equal(503, resps[i] and resps[i].status, ctx(gw)) end
        local before = up:stats().hits
        assert.is_true(before <= 40 and before >= 31, "hits: " .. before)
        local old = gw:workers()
        assert.equal(2, #old)
        -- kill one worker outright (no chance to clean up); the master starts another
        assert.truthy(H.pid_alive(old[1]))
        os.execute("kill -9 " .. old[1])
        local renewed = H.wait_until(function()
            local now = gw:workers()
            if #now == 2 and now[1] ~= old[1] and now[2] ~= old[1] then return now end
        end, 5)
        assert.truthy(renewed, ctx(gw, "no worker replaced the killed one"))
        assert.truthy(gw:log():find("worker process " .. old[1], 1, true) or true)
        -- both workers, the new one too, see the empty budget: one attempt per request, no retry
        up:reset()
        up:program({ default = { status = 503, body = "down\n" } })
        local n = 40
        resps = burst(gw.port, paths("/after-kill/", n), 4)
        for i = 1, n do assert.equal(503, resps[i] and resps[i].status, ctx(gw)) end
        assert.truthy(logged(gw, "/after-kill/", n), ctx(gw, "access log incomplete"))
        local per, pids = by_worker(gw, "/after-kill/")
        assert.equal(2, pids, "all requests went to one worker: " .. json.encode(per))
        local newpid = renewed[1] == old[2] and renewed[2] or renewed[1]
        assert.truthy(per[tostring(newpid)], "the new worker served nothing: " .. json.encode(per))
        assert.equal(n, up:stats().hits, ctx(gw, "a worker had a fresh budget"))
        -- and it refills when the upstream recovers: 20 good answers earn 10 tokens
        up:program({ default = 200 })
        resps = burst(gw.port, paths("/recovered/", 20), 4)
        for i = 1, 20 do assert.equal(200, resps[i] and resps[i].status, ctx(gw)) end
        up:reset()
        up:program({ sequence = { 503 }, default = 200 })
        local resp = H.request(gw.port, { path = "/retried" })
        assert.equal(200, resp and resp.status, ctx(gw))
        assert.equal(2, up:stats().hits)
    end)
end)

local BROWNOUT = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream flaky {
        server {{UPSTREAM}};
        # retries may wait far longer than the spec takes to end the brownout, however busy the machine
        retry_budget adaptive max=10 wait=60s;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        # no cap on attempts: a capped request may spend its whole count on
        # tokens in the first milliseconds (the bucket is first come, first
        # served) and fail before the brownout is over; what is tested here
        # is that the others wait instead of failing
        retry_attempts 0;
        retry_timeout 60s;
        retry_backoff 10ms 20ms;
        location / {
            proxy_pass http://flaky;
        }
    }
}
]]

describe("a brownout after healthy traffic", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = BROWNOUT, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("is waited out: requests hold their retries instead of failing, then all succeed", function()
        -- healthy traffic fills the bucket (10 tokens)
        local resps = burst(gw.port, paths("/warm/", 30), 6)
        for i = 1, 30 do assert.equal(200, resps[i] and resps[i].status, ctx(gw)) end
        -- the upstream browns out; 30 requests arrive at once and are sent from background connections
        up:reset()
        up:program({ default = { status = 503, body = "brownout\n" } })
        local conns = {}
        for i = 1, 30 do
            conns[i] = assert(H.connect(gw.port))
            assert(conns[i]:send(H.build_request(gw.port, { path = "/brown/" .. i })))
        end
        -- every one got its first attempt; the bucket paid for 10 failing retries, the rest wait
        assert.truthy(#up:wait_hits(40, 20) >= 40, ctx(gw))
        H.sleep(1.0)
        local hits = up:hits({ bodies = false })
        local during, span = #hits, socket.gettime() - hits[1].time
        -- 30 first attempts, 10 paid retries, a probe every 100 ms of the brownout so far (about 1 s, more on a
        -- busy machine): nothing like the thousands of retries every 10-20 ms of 30 requests would be
        local probes = math.ceil(span / 0.1) + 5
        assert.is_true(during <= 30 + 10 + probes,
            ("upstream attempts during the %.1f s of the brownout: %d"):format(span, during))
        up:program({ default = { status = 200, body = "back\n" } })
        local ok = 0
        for i = 1, 30 do
            local resp = conns[i]:read_response({ timeout = 30 })
            if resp and resp.status == 200 and resp.body == "back\n" then ok = ok + 1 end
            conns[i]:close()
        end
        assert.equal(30, ok, ctx(gw, "requests answered 200 after the brownout"))
    end)
end)
