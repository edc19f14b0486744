-- The retry engine end to end: the real binary in front of the fault upstream (tests/tools/fault_upstream.lua).
-- Every test checks what the client got AND what reached the upstream (its recorded hits, headers, bodies and
-- arrival times). DESIGN.md §1-§4 and conf/REFERENCE.md "Retries" are the contract.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local json = H.json
local now = socket.gettime

---------------------------------------------------------------------------
-- small utilities
---------------------------------------------------------------------------

-- A header of an upstream hit record (case-insensitive; the last value).
local function hv(hit, name)
    local v
    for _, h in ipairs(hit.headers or {}) do
        if h[1]:lower() == name:lower() then v = h[2] end
    end
    return v
end

-- Every value of a header in an upstream hit record.
local function hvals(hit, name)
    local out = {}
    for _, h in ipairs(hit.headers or {}) do
        if h[1]:lower() == name:lower() then out[#out + 1] = h[2] end
    end
    return out
end

-- X-Ricochet-Attempt of each hit, as numbers.
local function attempt_numbers(hits)
    local out = {}
    for i, h in ipairs(hits) do out[i] = tonumber(hv(h, "X-Ricochet-Attempt")) or -1 end
    return out
end

local function text_body(n, seed) return H.text_body(n, seed or 4242) end

-- The body a hit carried (bodies that are not UTF-8 come as hex).
local function hit_body(hit)
    if hit.body_hex then
        return (hit.body_hex:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
    end
    return hit.body or ""
end

local ctx = H.context

-- Access log entries (decoded) of one request path, in order.
local function access_entries(gw, path)
    local out = {}
    local data = H.read_file(gw.prefix .. "/logs/access.log") or ""
    for line in data:gmatch("([^\n]+)\n") do
        local ok, e = pcall(json.decode, line)
        if ok and type(e) == "table" and e.path == path then out[#out + 1] = e end
    end
    return out
end

-- Waits (bounded) for the access log line of path; returns the last entry or nil.
local function access_entry(gw, path, seconds)
    local list = H.wait_until(function()
        local l = access_entries(gw, path)
        if #l > 0 then return l end
    end, seconds or 3)
    return list and list[#list] or nil
end

local UUID4 = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89abAB]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

---------------------------------------------------------------------------
-- one gateway, one upstream: most of the policy
---------------------------------------------------------------------------

local MAIN = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream one {
        server {{UPSTREAM}};
        # these specs make most requests fail before they succeed, which
        # drains the adaptive budget by design (its specs are below)
        retry_budget off;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 10ms 50ms;
        client_max_body_size 1m;
        location / {
            proxy_pass http://one;
        }
        location /key/ {
            idempotency_key on;
            proxy_pass http://one;
        }
        location /auto/ {
            idempotency_key auto;
            proxy_pass http://one;
        }
        location /small/ {
            retry_body_max 1k;
            client_max_body_size 64k;
            proxy_pass http://one;
        }
        location /ra/ {
            retry_after_max 30s;
            retry_backoff 10ms 20ms jitter=none adaptive=off;
            proxy_pass http://one;
        }
        location /slow/ {
            retry_backoff 2s 2s jitter=none adaptive=off;
            proxy_pass http://one;
        }
        # a backoff far longer than any deadline these specs give, so that waiting it is told apart
        # from answering at once however busy the machine is
        location /slower/ {
            retry_backoff 20s 20s jitter=none adaptive=off;
            proxy_pass http://one;
        }
        # an attempt that only the client's deadline can end early
        location /late/ {
            retry_timeout 25s;
            per_try_timeout 20s;
            proxy_pass http://one;
        }
        location /deadline/ {
            retry_timeout 5s;
            per_try_timeout 2s;
            retry_backoff 100ms 100ms jitter=none adaptive=off;
            proxy_pass http://one;
        }
        location /off/ {
            retries off;
            proxy_pass http://one;
        }
        location /on500/ {
            retry_on 500;
            proxy_pass http://one;
        }
        location /log/ {
            retry_backoff 50ms 1s 2 jitter=none adaptive=off;
            proxy_pass http://one;
        }
        location /spill/ {
            client_body_buffer_size 16k;
            proxy_pass http://one;
        }
        location /zero/ {
            retry_attempts 0;
            retry_timeout 3s;
            per_try_timeout 1s;
            retry_backoff 100ms 100ms jitter=none adaptive=off;
            proxy_pass http://one;
        }
        location /lastresp/ {
            retry_attempts 2;
            per_try_timeout 2s;
            proxy_pass http://one;
        }
        location /many/ {
            retry_attempts 20;
            retry_backoff 1ms 1ms jitter=none adaptive=off;
            proxy_pass http://one;
        }
        location /names/ {
            retry_attempt_header X-Try;
            client_deadline_header X-Budget-Ms;
            idempotency_key on;
            idempotency_key_header X-Op-Id;
            proxy_pass http://one;
        }
    }
}
]]

describe("retries through one upstream", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = MAIN, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
    end)

    -- the basic loop --------------------------------------------------------

    it("retries a GET through 503, 503 to the 200, numbering the attempts", function()
        up:program({ sequence = { 503, 503 }, default = { status = 200, body = "finally\n" } })
        local resp, err = H.request(gw.port, { path = "/basic?q=1", headers = {
            ["Authorization"] = "Bearer tok-123", ["Cookie"] = "sid=abc", ["X-Custom"] = "keep-me" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("finally\n", resp.body)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        assert.same({ 1, 2, 3 }, attempt_numbers(hits))
        for i, h in ipairs(hits) do
            assert.equal("GET", h.method)
            assert.equal("/basic?q=1", h.target)
            assert.equal(1, #hvals(h, "X-Ricochet-Attempt"), "one attempt header per request")
            -- every original header, auth included, on every attempt; nothing piles up across attempts
            assert.same({ "Bearer tok-123" }, hvals(h, "Authorization"), "attempt " .. i)
            assert.same({ "sid=abc" }, hvals(h, "Cookie"), "attempt " .. i)
            assert.same({ "keep-me" }, hvals(h, "X-Custom"), "attempt " .. i)
            assert.same({ "127.0.0.1" }, hvals(h, "X-Forwarded-For"), "attempt " .. i)
            assert.equal(1, #hvals(h, "X-Request-Timeout"), "attempt " .. i)
        end
    end)

    it("drops an X-Ricochet-Attempt the client sent", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/spoof", headers = { ["X-Ricochet-Attempt"] = "77" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.same({ "1" }, hvals(hits[1], "X-Ricochet-Attempt"))
        assert.same({ "2" }, hvals(hits[2], "X-Ricochet-Attempt"))
    end)

    it("gives the client the upstream's own last 503 after exactly retry_attempts attempts", function()
        up:program({ default = { status = 503, body = "upstream says: down for maintenance #7731\n",
            headers = { ["X-Upstream-Mark"] = "m-7731", ["Content-Type"] = "text/x-down" } } })
        local resp, err = H.request(gw.port, { path = "/down" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("upstream says: down for maintenance #7731\n", resp.body)
        assert.equal("m-7731", resp.headers["x-upstream-mark"])
        assert.equal("text/x-down", resp.headers["content-type"])
        assert.truthy(resp.headers["x-fault-hit"], "the 503 is the upstream's, not the gateway's")
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        assert.same({ 1, 2, 3 }, attempt_numbers(hits))
        -- the client got the last attempt's answer
        assert.equal(tostring(hits[3].n), resp.headers["x-fault-hit"])
    end)

    -- replay safety ---------------------------------------------------------

    it("never repeats a POST without a key: one attempt, the 503 passed through", function()
        up:program({ sequence = { { status = 503, body = "busy\n" } }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/pay", body = "amount=10" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("busy\n", resp.body)
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits)
        assert.equal("amount=10", hits[1].body)
        assert.is_nil(hv(hits[1], "Idempotency-Key"), "no key is minted without idempotency_key auto")
    end)

    it("never repeats a POST without a key on an idempotency_key on route", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/key/nokey", body = "x=1" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        local hits = up:hits()
        assert.equal(1, #hits)
        assert.is_nil(hv(hits[1], "Idempotency-Key"))
    end)

    it("retries a POST with an Idempotency-Key on an idempotency_key on route, same key and bytes", function()
        up:program({ sequence = { 503, 503 }, default = { status = 201, body = "charged\n" } })
        local body = '{"amount":4200,"currency":"EUR","note":"' .. text_body(300, 7) .. '"}'
        local resp, err = H.request(gw.port, { method = "POST", path = "/key/charge", body = body,
            headers = { ["Idempotency-Key"] = "order-8812-a", ["Content-Type"] = "application/json" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(201, resp.status)
        assert.equal("charged\n", resp.body)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        assert.same({ 1, 2, 3 }, attempt_numbers(hits))
        for i, h in ipairs(hits) do
            assert.equal("POST", h.method)
            assert.same({ "order-8812-a" }, hvals(h, "Idempotency-Key"), "attempt " .. i)
            assert.is_true(hit_body(h) == body, "attempt " .. i .. " body differs")
            assert.equal(tostring(#body), hv(h, "Content-Length"))
            assert.equal("application/json", hv(h, "Content-Type"))
        end
    end)

    it("idempotency_key auto mints one UUIDv4 for a keyless POST and sends it on every attempt", function()
        up:program({ sequence = { 503, 502 }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/auto/order", body = "sku=1&qty=2" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        local key = hv(hits[1], "Idempotency-Key")
        assert.truthy(key, "no minted key upstream")
        assert.matches(UUID4, key)
        for i, h in ipairs(hits) do
            assert.same({ key }, hvals(h, "Idempotency-Key"), "attempt " .. i)
            assert.equal("sku=1&qty=2", hit_body(h))
        end
        -- a second request gets a key of its own
        up:reset()
        up:program({ default = 200 })
        assert.equal(200, assert(H.request(gw.port, { method = "POST", path = "/auto/order2", body = "a" })).status)
        local key2 = hv(up:hits()[1], "Idempotency-Key")
        assert.matches(UUID4, key2 or "")
        assert.are_not.equal(key, key2)
    end)

    it("idempotency_key auto keeps the client's own key and mints nothing", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/auto/own", body = "z",
            headers = { ["Idempotency-Key"] = "client-key-1" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits)
        for _, h in ipairs(hits) do assert.same({ "client-key-1" }, hvals(h, "Idempotency-Key")) end
    end)

    it("replays a chunked PUT byte for byte, with a Content-Length, on every attempt", function()
        up:program({ sequence = { 503, 504 }, default = 204 })
        local body = text_body(20000, 99) .. "\0\1\2\255 end"
        local resp, err = H.request(gw.port, { method = "PUT", path = "/obj/chunked", body = body,
            chunked = true, chunk_size = 1500 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(204, resp.status)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        for i, h in ipairs(hits) do
            assert.equal("PUT", h.method)
            assert.is_false(h.chunked, "attempt " .. i .. " went up chunked")
            assert.equal(tostring(#body), hv(h, "Content-Length"), "attempt " .. i)
            assert.is_nil(hv(h, "Transfer-Encoding"))
            assert.equal(#body, h.body_len)
            assert.is_true(hit_body(h) == body, "attempt " .. i .. " body differs")
        end
    end)

    it("sends a body over retry_body_max once and never retries it", function()
        up:program({ default = { status = 503, body = "nope\n" } })
        local body = text_body(4096, 5)
        local resp, err = H.request(gw.port, { method = "PUT", path = "/small/big", body = body })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("nope\n", resp.body)
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw))
        assert.is_true(hit_body(hits[1]) == body, "the one attempt carried the whole body")
    end)

    it("sends a chunked body over retry_body_max once, whole, and never retries it", function()
        up:program({ default = { status = 503, body = "nope\n" } })
        local body = text_body(8192, 8)
        local resp, err = H.request(gw.port, { method = "PUT", path = "/small/chunked", body = body,
            chunked = true, chunk_size = 1000 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("nope\n", resp.body)
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw))
        assert.is_true(hit_body(hits[1]) == body, "the one attempt carried the whole body")
        assert.is_nil(hits[1].incomplete)
    end)

    it("still retries a body at retry_body_max's size", function()
        up:program({ sequence = { 503 }, default = 200 })
        local body = text_body(1024, 6)
        local resp, err = H.request(gw.port, { method = "PUT", path = "/small/fits", body = body })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        for _, h in ipairs(hits) do assert.is_true(hit_body(h) == body) end
    end)

    -- Retry-After -----------------------------------------------------------

    it("honours Retry-After: 1 on a 429 (attempts >= 0.9 s apart at the upstream)", function()
        up:program({ sequence = { { status = 429, headers = { ["Retry-After"] = "1" } } }, default = 200 })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/ra/secs", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        local gap = hits[2].time - hits[1].time
        -- a timer never fires early: the lower bound is exact; the upper one only says it was not
        -- retry_after_max (30 s), with room for a busy machine
        assert.is_true(gap >= 0.9, ("second attempt only %.3f s after the first"):format(gap))
        assert.is_true(gap < 10, ("second attempt %.3f s after the first"):format(gap))
        assert.is_true(now() - t0 < 15)
        local e = access_entry(gw, "/ra/secs")
        assert.truthy(e, "no access log line")
        assert.equal(429, e.attempts[1].status)
        assert.is_true(math.abs(e.attempts[2].wait - 1) < 0.05, "logged wait " .. tostring(e.attempts[2].wait))
    end)

    it("falls back to backoff for a Retry-After above retry_after_max", function()
        up:program({ sequence = { { status = 503, headers = { ["Retry-After"] = "3600" } } }, default = 200 })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/ra/huge", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        -- the 20 ms backoff, not the hour nor retry_after_max (30 s): bounds far from both
        local gap = hits[2].time - hits[1].time
        assert.is_true(gap < 10, ("second attempt %.3f s after the first"):format(gap))
        assert.is_true(now() - t0 < 15)
    end)

    it("falls back to backoff for an invalid Retry-After", function()
        up:program({ sequence = { { status = 503, headers = { ["Retry-After"] = "soon-ish" } } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/ra/invalid", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        assert.is_true(hits[2].time - hits[1].time < 10)
    end)

    it("honours a Retry-After HTTP-date (IMF-fixdate) in the near future", function()
        -- the retry is due at the named second: it goes no earlier (a timer never fires early), whenever the
        -- first attempt got there on a busy machine
        local at = os.time() + 3
        local date = os.date("!%a, %d %b %Y %H:%M:%S GMT", at)
        up:program({ sequence = { { status = 503, headers = { ["Retry-After"] = date } } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/ra/date", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        assert.is_true(hits[2].time >= at - 0.05,
            ("Retry-After %q: second attempt %.3f s before it"):format(date, at - hits[2].time))
        assert.is_true(hits[2].time - hits[1].time < 10, ("second attempt %.3f s later"):format(hits[2].time - hits[1].time))
    end)

    -- deadlines ---------------------------------------------------------------

    it("does not wait past a client deadline shorter than the first backoff", function()
        up:program({ default = { status = 503, body = "deadline-body\n" } })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/slower/x", headers = { ["X-Request-Timeout"] = "500" },
            timeout = 30 })
        local elapsed = now() - t0
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("deadline-body\n", resp.body)
        -- the backoff is 20 s: half of it is still far from what a busy machine adds
        assert.is_true(elapsed < 10, ("the 503 took %.3f s"):format(elapsed))
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw))
        local sent = hvals(hits[1], "X-Request-Timeout")
        assert.equal(1, #sent, "one deadline header upstream, the client's replaced")
        local ms = tonumber(sent[1])
        assert.truthy(ms, "X-Request-Timeout upstream is not a number: " .. tostring(sent[1]))
        assert.is_true(ms <= 500 and ms >= 0, "X-Request-Timeout upstream: " .. sent[1])
    end)

    it("accepts a client deadline given as a duration (1.9s)", function()
        up:program({ default = 503 })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/slower/dur", headers = { ["X-Request-Timeout"] = "1.9s" },
            timeout = 30 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.is_true(now() - t0 < 10, "waited for the 20 s backoff past a 1.9 s deadline")
        local hits = up:hits()
        assert.equal(1, #hits)
        -- the fraction counts (1 s would be at most 1000), and the attempt may go out up to 0.9 s late
        local ms = tonumber(hv(hits[1], "X-Request-Timeout"))
        assert.truthy(ms)
        assert.is_true(ms <= 1900 and ms > 1000, "X-Request-Timeout upstream: " .. tostring(ms))
    end)

    it("sends the remaining deadline upstream, decreasing, within retry_timeout", function()
        up:program({ sequence = { 503, 503 }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/deadline/left" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        local left = {}
        for i, h in ipairs(hits) do
            local v = hvals(h, "X-Request-Timeout")
            assert.equal(1, #v, "attempt " .. i)
            left[i] = tonumber(v[1])
            assert.truthy(left[i], "attempt " .. i .. ": " .. tostring(v[1]))
            assert.is_true(left[i] <= 5000 and left[i] > 0, "attempt " .. i .. ": " .. left[i])
        end
        assert.is_true(left[1] > left[2] and left[2] > left[3],
            ("not decreasing: %d %d %d"):format(left[1], left[2], left[3]))
        -- 100 ms of backoff before each retry
        assert.is_true(left[1] - left[3] >= 150, ("%d -> %d"):format(left[1], left[3]))
    end)

    -- kill switch and retry_on -------------------------------------------------

    it("retries off in a location makes one attempt", function()
        up:program({ sequence = { 503, 503 }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/off/x" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        H.sleep(0.2)
        assert.equal(1, up:stats().hits)
    end)

    it("retry_on 500 retries a 500 and passes a 503 through", function()
        up:program({ routes = {
            ["/on500/a"] = { sequence = { 500 }, default = { status = 200, body = "a-ok" } },
            ["/on500/b"] = { sequence = { { status = 503, body = "b-503" } }, default = 200 },
        } })
        local resp, err = H.request(gw.port, { path = "/on500/a" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("a-ok", resp.body)
        local resp2, err2 = H.request(gw.port, { path = "/on500/b" })
        assert.truthy(resp2, ctx(gw, err2))
        assert.equal(503, resp2.status)
        assert.equal("b-503", resp2.body)
        local a, b = 0, 0
        for _, h in ipairs(up:hits()) do
            if h.path == "/on500/a" then a = a + 1 elseif h.path == "/on500/b" then b = b + 1 end
        end
        assert.equal(2, a)
        assert.equal(1, b)
    end)

    it("does not retry a status outside retry_on (default: 500)", function()
        up:program({ sequence = { { status = 500, body = "boom" } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/plain500" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(500, resp.status)
        assert.equal("boom", resp.body)
        assert.equal(1, up:stats().hits)
    end)

    -- resets -----------------------------------------------------------------------

    it("never retries once response bytes reached the client (reset mid-body)", function()
        local n = 1024 * 1024
        up:program({ sequence = { { status = 200, body_size = n, reset = "mid_body" } }, default = 200 })
        local resp, err, partial = H.request(gw.port, { path = "/midbody", timeout = 8 })
        assert.is_nil(resp, "a complete response arrived although the upstream reset mid-body")
        assert.truthy(partial, "no response head reached the client: " .. tostring(err))
        assert.equal(200, partial.status)
        assert.is_true(#partial.body < n, "the body was not cut short")
        assert.truthy(err == "closed" or err == "reset", "client connection not closed: " .. tostring(err))
        H.sleep(0.3)
        assert.equal(1, up:stats().hits, ctx(gw))
    end)

    it("retries a GET whose connection was reset before the response head", function()
        up:program({ sequence = { { reset = "before_head" } }, default = { status = 200, body = "second\n" } })
        local resp, err = H.request(gw.port, { path = "/rst/get" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("second\n", resp.body)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        assert.same({ 1, 2 }, attempt_numbers(hits))
        local e = access_entry(gw, "/rst/get")
        assert.truthy(e, "no access log line")
        assert.equal(2, #e.attempts)
        assert.equal("reset", e.attempts[1].class)
    end)

    it("does not retry a keyless POST reset before the head: 502", function()
        up:program({ sequence = { { reset = "before_head" } }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/rst/post", body = "once" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(502, resp.status)
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw))
        assert.equal("once", hits[1].body)
    end)

    -- more edges ---------------------------------------------------------------------

    it("retries when the client deadline leaves room for the wait", function()
        up:program({ sequence = { 503 }, default = 200 })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/slow/room", headers = { ["X-Request-Timeout"] = "4000" },
            timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        assert.is_true(hits[2].time - hits[1].time >= 1.9, "the 2 s backoff was not waited")
        assert.is_true(now() - t0 < 10)
        local l1, l2 = tonumber(hv(hits[1], "X-Request-Timeout")), tonumber(hv(hits[2], "X-Request-Timeout"))
        assert.is_true(l1 <= 4000 and l2 <= 2000 and l2 > 0, ("deadline headers %s, %s"):format(l1, l2))
    end)

    it("answers at once when a Retry-After would end past the client deadline", function()
        -- a wait of 20 s against a deadline of 10 s: answering at once is told apart from waiting out the
        -- deadline by 5 s, more than a busy machine adds
        up:program({ sequence = { { status = 429, body = "slow down", headers = { ["Retry-After"] = "20" } } },
            default = 200 })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/ra/past", headers = { ["X-Request-Timeout"] = "10000" },
            timeout = 30 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(429, resp.status)
        assert.equal("slow down", resp.body)
        assert.equal("20", resp.headers["retry-after"])
        assert.is_true(now() - t0 < 5, "waited for nothing")
        assert.equal(1, up:stats().hits)
    end)

    it("ends an attempt at the deadline: 504 promptly, not after the upstream's delay", function()
        -- the upstream answers after 30 s and per_try_timeout is 20 s: only the 500 ms deadline ends it
        -- within 10 s
        up:program({ default = { status = 200, delay_ms = 30000 } })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/late/mid", headers = { ["X-Request-Timeout"] = "500" },
            timeout = 40 })
        local elapsed = now() - t0
        assert.truthy(resp, ctx(gw, err))
        assert.equal(504, resp.status)
        assert.is_true(elapsed < 10, ("the 504 took %.3f s"):format(elapsed))
        assert.equal(1, up:stats().hits)
    end)

    it("ignores an invalid client deadline", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/deadline/bad", headers = { ["X-Request-Timeout"] = "soon" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits)
        local ms = tonumber(hv(hits[1], "X-Request-Timeout"))
        assert.truthy(ms, "the client's invalid value went upstream: " .. tostring(hv(hits[1], "X-Request-Timeout")))
        -- the location's 5 s (not the default 30 s), the first attempt sent up to 2.5 s late on a busy machine
        assert.is_true(ms <= 5000 and ms > 2500, "X-Request-Timeout upstream: " .. ms)
    end)

    it("retry_attempts 0 retries until retry_timeout runs out", function()
        up:program({ default = { status = 503, body = "still down" } })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/zero/x", timeout = 20 })
        local elapsed = now() - t0
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("still down", resp.body)
        assert.is_true(elapsed < 8, ("took %.3f s with retry_timeout 3s"):format(elapsed))
        local n = up:stats().hits
        -- at least 100 ms between attempts within 3 s: at most 31 (timers never fire early); past the
        -- default 3 attempts by far, even when a busy machine makes each attempt take several times longer
        assert.is_true(n >= 5 and n <= 31, ("%d attempts"):format(n))
    end)

    it("replays a body that spilled to a temp file, byte for byte", function()
        up:program({ sequence = { 503, 503 }, default = 200 })
        local body = text_body(200000, 31)
        local resp, err = H.request(gw.port, { method = "PUT", path = "/spill/big", body = body, timeout = 10 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(3, #hits, ctx(gw))
        for i, h in ipairs(hits) do
            assert.equal(#body, h.body_len, "attempt " .. i)
            assert.is_true(hit_body(h) == body, "attempt " .. i .. " body differs")
        end
    end)

    it("drops a large 503 it retries past and never reuses its half-read connection", function()
        up:program({ sequence = { { status = 503, body_size = 300000 } }, default = { status = 200, body = "fine" } })
        local resp, err = H.request(gw.port, { path = "/bigfail/1", timeout = 8 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("fine", resp.body)
        for i = 2, 4 do
            local r, e = H.request(gw.port, { path = "/bigfail/" .. i, timeout = 5 })
            assert.truthy(r, ctx(gw, e))
            assert.equal(200, r.status)
            assert.equal("fine", r.body)
        end
        assert.equal(5, up:stats().hits)
    end)

    it("uses the configured header names for attempts, deadlines and keys", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/names/x", body = "b",
            headers = { ["X-Op-Id"] = "op-1", ["X-Budget-Ms"] = "3000", ["X-Try"] = "9" } })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local hits = up:hits()
        assert.equal(2, #hits, ctx(gw))
        for i, h in ipairs(hits) do
            assert.same({ tostring(i) }, hvals(h, "X-Try"))
            assert.is_nil(hv(h, "X-Ricochet-Attempt"))
            local ms = tonumber(hv(h, "X-Budget-Ms"))
            assert.truthy(ms and ms <= 3000, tostring(hv(h, "X-Budget-Ms")))
            assert.same({ "op-1" }, hvals(h, "X-Op-Id"))
        end
    end)

    it("stops retrying when the client goes away during the backoff", function()
        up:program({ default = 503 })
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = "/slow/gone" })))
        assert.truthy(H.wait_until(function() return up:stats().hits >= 1 end, 3))
        H.sleep(0.2)
        conn:close()
        H.sleep(2.4) -- past the 2 s backoff
        assert.equal(1, up:stats().hits, ctx(gw))
        -- and the gateway still serves
        up:program({ default = 200 })
        local resp, err = H.request(gw.port, { path = "/after-gone" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
    end)

    it("does not let an empty Idempotency-Key make a POST replay-safe", function()
        up:program({ sequence = { 503 }, default = 200 })
        local resp, err = H.request(gw.port, { method = "POST", path = "/key/empty", body = "pay=1",
            headers = { { "Idempotency-Key", "" } } })
        assert.truthy(resp, ctx(gw, err))
        H.sleep(0.1)
        -- an empty key names nothing the upstream could deduplicate on: the POST is as unsafe as a keyless one
        assert.equal(1, up:stats().hits, "a POST with an empty Idempotency-Key was repeated")
        assert.equal(503, resp.status)
    end)

    -- DESIGN §1.5 / REFERENCE "Retries": "only when no response arrived at all does the gateway answer itself"
    it("gives the client the upstream's 503 when the retry after it times out", function()
        up:program({ sequence = { { status = 503, body = "first-503", headers = { ["X-Mark"] = "a1" } },
            { status = 200, delay_ms = 30000 } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/lastresp/timeout", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(2, up:stats().hits)
        assert.equal(503, resp.status, "the gateway answered " .. resp.status .. " although the upstream's 503 arrived")
        assert.equal("first-503", resp.body)
        assert.equal("a1", resp.headers["x-mark"])
    end)

    it("gives the client the upstream's 503 when the retry after it is reset", function()
        up:program({ sequence = { { status = 503, body = "first-503" }, { reset = "before_head" } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/lastresp/reset", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(2, up:stats().hits)
        assert.equal(503, resp.status, "the gateway answered " .. resp.status .. " although the upstream's 503 arrived")
        assert.equal("first-503", resp.body)
    end)

    it("keeps a chunked 503 that arrives in pieces and passes it on when the retry gets no response", function()
        up:program({ sequence = { { status = 503, body_size = 6000, chunked = true, chunk_size = 1000,
            chunk_delay_ms = 30, headers = { ["X-Mark"] = "kept" } }, { reset = "before_head" } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/lastresp/chunked", timeout = 20 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(2, up:stats().hits)
        assert.equal(503, resp.status)
        assert.equal("kept", resp.headers["x-mark"])
        assert.is_true(resp.body == H.body_of_size(6000), "kept body differs (" .. #resp.body .. " bytes)")
        -- the client connection is still good
        up:reset()
        up:program({ default = { status = 200, body = "next" } })
        local r2, e2 = H.request(gw.port, { path = "/lastresp/next" })
        assert.truthy(r2, ctx(gw, e2))
        assert.equal("next", r2.body)
    end)

    -- A 503 whose body stalls half-way: the gateway may read it to keep it, but never past the deadline.
    it("does not wait past the deadline while reading a retried response's stalled body", function()
        up:program({ sequence = { { status = 503, body_size = 20000, chunk_size = 10000, chunk_delay_ms = 30000 } },
            default = { status = 200, body = "late" } })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/slow/stall", headers = { ["X-Request-Timeout"] = "2500" },
            timeout = 40 })
        local elapsed = now() - t0
        assert.truthy(resp, ctx(gw, err))
        local hits = up:hits()
        -- the 2 s backoff fits the 2.5 s deadline once; a retry sent later than the deadline is a broken promise.
        -- The body stalls for 30 s: an answer within 10 s did not wait for it.
        assert.is_true(elapsed < 10, ("answered after %.3f s with a 2.5 s deadline (status %d, %d attempts)")
            :format(elapsed, resp.status, #hits))
        if hits[2] then
            -- the time left the gateway wrote as it sent the attempt (never below 0): the upstream's own
            -- clock would add the way there, which a busy machine can stretch
            assert.is_true(tonumber(hv(hits[2], "X-Request-Timeout")) > 0, "attempt 2 was sent after the deadline")
        end
    end)

    it("keeps concurrent retried requests apart", function()
        local n = 8
        local routes = {}
        for i = 1, n do
            routes["/conc/" .. i] = { sequence = { 503, 502 }, default = { status = 200, body = "body-" .. i } }
        end
        up:program({ routes = routes })
        local conns = {}
        for i = 1, n do
            conns[i] = assert(H.connect(gw.port))
            assert(conns[i]:send(H.build_request(gw.port, { path = "/conc/" .. i })))
        end
        for i = 1, n do
            local resp, err = conns[i]:read_response({ timeout = 15 })
            conns[i]:close()
            assert.truthy(resp, ctx(gw, ("request %d: %s"):format(i, tostring(err))))
            assert.equal(200, resp.status)
            assert.equal("body-" .. i, resp.body)
        end
        local per = {}
        for _, h in ipairs(up:hits()) do
            per[h.path] = per[h.path] or {}
            table.insert(per[h.path], tonumber(hv(h, "X-Ricochet-Attempt")))
        end
        for i = 1, n do
            assert.same({ 1, 2, 3 }, per["/conc/" .. i], "/conc/" .. i)
        end
    end)

    -- access log ---------------------------------------------------------------------

    it("logs one attempt entry per attempt, with the backoff waits", function()
        up:program({ sequence = { 503, 502 }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/log/waits" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local e = access_entry(gw, "/log/waits")
        assert.truthy(e, "no access log line:\n" .. (H.read_file(gw.prefix .. "/logs/access.log") or ""))
        assert.equal(200, e.status)
        assert.equal(up.addr, e.upstream)
        assert.equal(3, #e.attempts, json.encode(e))
        local want = { { 503, 0 }, { 502, 0.05 }, { 200, 0.1 } }
        for i, a in ipairs(e.attempts) do
            assert.equal("status", a.class, json.encode(a))
            assert.equal(want[i][1], a.status, json.encode(a))
            assert.equal(up.addr, a.server)
            assert.is_true(math.abs(a.wait - want[i][2]) <= 0.02, ("attempt %d wait %s"):format(i, a.wait))
            assert.is_true(a.duration >= 0 and a.duration < 2)
        end
        assert.equal(3, up:stats().hits)
    end)

    it("logs every attempt of a long schedule (20 attempts), the last one included", function()
        up:program({ sequence = { 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503,
            503, 503, 503 }, default = { status = 200, body = "twentieth" } })
        local resp, err = H.request(gw.port, { path = "/many/x" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("twentieth", resp.body)
        assert.equal(20, up:stats().hits)
        local e = access_entry(gw, "/many/x")
        assert.truthy(e, "no access log line")
        assert.equal(20, #e.attempts, "access log attempts: " .. #e.attempts)
        assert.equal(200, e.attempts[#e.attempts].status, "the final attempt is missing from the log")
    end)
end)

---------------------------------------------------------------------------
-- servers that refuse connections
---------------------------------------------------------------------------

local REFUSING = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream mixed {
        server 127.0.0.1:{{DEAD1}};
        server {{UPSTREAM}};
    }
    upstream dead {
        server 127.0.0.1:{{DEAD1}};
        server 127.0.0.1:{{DEAD2}};
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 10ms 20ms;
        location /mixed/ {
            proxy_pass http://mixed;
        }
        location /dead/ {
            proxy_pass http://dead;
        }
    }
}
]]

describe("retries past refused connections", function()
    local up, gw, dead

    setup(function()
        up = H.start_upstream()
        dead = H.dead_ports(2)
        gw = H.start_gateway({ conf = REFUSING, upstream = up,
            vars = { DEAD1 = dead[1], DEAD2 = dead[2] } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
    end)

    -- must run first: a fresh worker's round robin starts with the first server
    it("serves a keyless POST from the second server when the first refuses", function()
        up:program({ default = { status = 201, body = "made\n" } })
        local resp, err = H.request(gw.port, { method = "POST", path = "/mixed/make", body = "thing=1" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(201, resp.status)
        assert.equal("made\n", resp.body)
        local hits = up:hits()
        assert.equal(1, #hits)
        assert.equal("thing=1", hits[1].body)
        local e = access_entry(gw, "/mixed/make")
        assert.truthy(e, "no access log line")
        assert.equal(2, #e.attempts, json.encode(e))
        assert.equal("connect_error", e.attempts[1].class)
        assert.equal("127.0.0.1:" .. dead[1], e.attempts[1].server)
        assert.equal("status", e.attempts[2].class)
        assert.equal(201, e.attempts[2].status)
        assert.equal(up.addr, e.attempts[2].server)
        assert.equal(up.addr, e.upstream)
        -- the upstream saw the second attempt
        assert.equal("2", hv(hits[1], "X-Ricochet-Attempt"))
    end)

    it("answers 502 when every server refuses, after retry_attempts connect errors", function()
        local resp, err = H.request(gw.port, { path = "/dead/x" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(502, resp.status)
        local e = access_entry(gw, "/dead/x")
        assert.truthy(e, "no access log line")
        assert.equal(502, e.status)
        assert.equal(3, #e.attempts, json.encode(e))
        for i, a in ipairs(e.attempts) do
            assert.equal("connect_error", a.class, "attempt " .. i)
        end
        assert.equal(0, up:stats().hits)
    end)
end)

---------------------------------------------------------------------------
-- two healthy servers: a retry goes to the other one
---------------------------------------------------------------------------

local TWO = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    upstream two {
        server {{UPSTREAM1}} max_fails=0;
        server {{UPSTREAM2}} max_fails=0;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 10ms 20ms;
        # a hundred times what a loopback answer takes, so that only a silent server times out
        per_try_timeout 2s;
        location / {
            proxy_pass http://two;
        }
    }
}
]]

describe("retries across two servers", function()
    local up1, up2, gw

    setup(function()
        up1 = H.start_upstream()
        up2 = H.start_upstream()
        gw = H.start_gateway({ conf = TWO, upstreams = { up1, up2 } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up1 then up1:stop() end
        if up2 then up2:stop() end
    end)

    before_each(function()
        up1:reset()
        up2:reset()
    end)

    -- Both servers answer their first request badly and later ones well, so whichever the round robin picks
    -- first, a retry that goes to the other server sees a bad answer again: attempts alternate A, B, A and the
    -- third one gets the 200. A retry to the same server would get its 200 at attempt 2.
    local function by_attempt()
        local list = {}
        for _, pair in ipairs({ { "up1", up1 }, { "up2", up2 } }) do
            for _, h in ipairs(pair[2]:hits()) do
                list[#list + 1] = { server = pair[1], attempt = tonumber(hv(h, "X-Ricochet-Attempt")), hit = h }
            end
        end
        table.sort(list, function(a, b) return (a.attempt or 0) < (b.attempt or 0) end)
        return list
    end

    it("sends the retry after a 503 to the other server", function()
        up1:program({ sequence = { 503 }, default = { status = 200, body = "one" } })
        up2:program({ sequence = { 503 }, default = { status = 200, body = "two" } })
        local resp, err = H.request(gw.port, { path = "/other" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local list = by_attempt()
        assert.equal(3, #list, ctx(gw))
        assert.same({ 1, 2, 3 }, { list[1].attempt, list[2].attempt, list[3].attempt })
        assert.are_not.equal(list[1].server, list[2].server, "attempt 2 went to the server that just failed")
        assert.are_not.equal(list[2].server, list[3].server, "attempt 3 went to the server that just failed")
        assert.equal(list[3].server == "up1" and "one" or "two", resp.body)
        local e = access_entry(gw, "/other")
        assert.truthy(e, "no access log line")
        assert.equal(3, #e.attempts)
        assert.are_not.equal(e.attempts[1].server, e.attempts[2].server)
    end)

    it("moves to the other server when per_try_timeout runs out", function()
        up1:program({ sequence = { { silent = true } }, default = { status = 200, body = "one" } })
        up2:program({ sequence = { { silent = true } }, default = { status = 200, body = "two" } })
        local t0 = now()
        local resp, err = H.request(gw.port, { path = "/pertry", timeout = 30 })
        local elapsed = now() - t0
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.is_true(elapsed >= 3.9 and elapsed < 15, ("took %.3f s"):format(elapsed))
        local list = by_attempt()
        assert.equal(3, #list, ctx(gw))
        assert.are_not.equal(list[1].server, list[2].server)
        assert.are_not.equal(list[2].server, list[3].server)
        assert.equal(list[3].server == "up1" and "one" or "two", resp.body)
        local e = access_entry(gw, "/pertry")
        assert.truthy(e, "no access log line")
        assert.equal(3, #e.attempts, json.encode(e))
        assert.equal("timeout", e.attempts[1].class, json.encode(e))
        assert.equal("timeout", e.attempts[2].class, json.encode(e))
        assert.equal("status", e.attempts[3].class, json.encode(e))
        assert.are_not.equal(e.attempts[1].server, e.attempts[2].server)
        -- each timed-out attempt lasted about per_try_timeout
        for i = 1, 2 do
            assert.is_true(e.attempts[i].duration >= 1.9 and e.attempts[i].duration < 8,
                "attempt " .. i .. " duration " .. tostring(e.attempts[i].duration))
        end
    end)
end)

---------------------------------------------------------------------------
-- the retry budget
---------------------------------------------------------------------------

local BUDGET = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream flaky {
        server {{UPSTREAM}};
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 5;
        retry_backoff 1ms 2ms;
        retry_budget 10% min=1/s;
        location / {
            proxy_pass http://flaky;
        }
    }
}
]]

describe("the retry budget", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = BUDGET, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("bounds the load an outage puts on the upstream", function()
        up:reset()
        up:program({ default = { status = 503, body = "outage\n" } })
        local conn = assert(H.connect(gw.port))
        local n, got503 = 40, 0
        local t0 = now()
        for i = 1, n do
            local resp, err = H.request(gw.port, { path = "/outage/" .. i, conn = conn })
            assert.truthy(resp, ctx(gw, ("request %d: %s"):format(i, tostring(err))))
            if resp.status == 503 and resp.body == "outage\n" then got503 = got503 + 1 end
        end
        conn:close()
        local windows = math.ceil((now() - t0) / 10)
        assert.equal(n, got503, "every client gets the upstream's 503")
        local hits = up:stats().hits
        -- without a budget: 40 * 5 = 200; with it: 40 + max(10% of 40, 1/s * 10 s) = 50 in each 10 s window
        -- the requests took (one, unless the machine is very busy: the floor refills with time)
        assert.is_true(hits <= n + 10 * windows + 5,
            ("the upstream saw %d requests for %d client requests in %d windows"):format(hits, n, windows))
        assert.is_true(hits > n, "no retries at all: the budget floor (min=1/s) allows 10")
    end)
end)

---------------------------------------------------------------------------
-- RICOCHET_NO_RETRY=1
---------------------------------------------------------------------------

local KILLED = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream one {
        server {{UPSTREAM}};
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retries on;
        retry_attempts 3;
        retry_backoff 10ms 20ms;
        location / {
            proxy_pass http://one;
        }
    }
}
]]

describe("RICOCHET_NO_RETRY=1", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = KILLED, upstream = up, env = { RICOCHET_NO_RETRY = "1" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("makes a GET a single attempt whatever the configuration says", function()
        up:reset()
        up:program({ sequence = { { status = 503, body = "first" } }, default = 200 })
        local resp, err = H.request(gw.port, { path = "/killed" })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(503, resp.status)
        assert.equal("first", resp.body)
        H.sleep(0.2)
        local hits = up:hits()
        assert.equal(1, #hits, ctx(gw))
        -- a single attempt is still numbered
        assert.equal("1", hv(hits[1], "X-Ricochet-Attempt"))
    end)
end)

---------------------------------------------------------------------------
-- configuration errors (ricochet -t)
---------------------------------------------------------------------------

describe("retry configuration errors", function()
    local dir

    setup(function()
        dir = H.mkdtemp("conf")
    end)

    teardown(function()
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    -- Writes a config whose location holds `lines` (the first of them on line 6) and runs -t on it.
    local function check(lines)
        local conf = table.concat({
            "worker_processes 1;",
            "http {",
            "    server {",
            "        listen 127.0.0.1:1;",
            "        location / {",
            "            " .. table.concat(lines, "\n            "),
            "            proxy_pass http://127.0.0.1:2;",
            "        }",
            "    }",
            "}",
            "",
        }, "\n")
        local path = dir .. "/ricochet.conf"
        H.write_file(path, conf)
        return H.run({ H.bin(), "-t", "-c", path }, { timeout = 10 })
    end

    local function assert_refused(code, out, lines_ok, what)
        assert.equal(1, code, out)
        local line = tonumber(out:match("ricochet%.conf:(%d+): "))
        assert.truthy(line, "no FILE:LINE: in: " .. out)
        local ok = false
        for _, l in ipairs(lines_ok) do ok = ok or l == line end
        assert.is_true(ok, "wrong line " .. line .. " in: " .. out)
        if what then assert.truthy(out:lower():find(what, 1, true), out) end
        assert.matches("test failed", out)
    end

    it("accepts a valid retry policy", function()
        local code, out = check({
            "retry_attempts 0;", "retry_backoff 100ms 2s 1.5 jitter=equal;", "retry_timeout 20s;",
            "per_try_timeout 20s;", "retry_on connect_error 5xx 429;", "retry_after_max 10s;",
            "retry_budget 0.3 min=2/s;", "retry_body_max 64k;", "retries off;", "idempotency_key auto;",
            "client_deadline_header X-Deadline;", "retry_attempt_header off;",
            "idempotency_key_header X-Key;",
        })
        assert.equal(0, code, out)
    end)

    it("refuses retry_attempts -1", function()
        local code, out = check({ "retry_attempts -1;" })
        assert_refused(code, out, { 6 }, "retry_attempts")
    end)

    it("refuses retry_backoff with INITIAL above MAX", function()
        local code, out = check({ "retry_backoff 5s 1s;" })
        assert_refused(code, out, { 6 }, "retry_backoff")
    end)

    it("refuses retry_backoff with a FACTOR below 1", function()
        local code, out = check({ "retry_backoff 1s 5s 0.5;" })
        assert_refused(code, out, { 6 }, "retry_backoff")
    end)

    it("refuses per_try_timeout above retry_timeout", function()
        local code, out = check({ "retry_timeout 30s;", "per_try_timeout 40s;" })
        -- the check spans two directives: the line of per_try_timeout (7) or of the block (5) will do
        assert_refused(code, out, { 5, 7 }, "per_try_timeout")
    end)

    -- per_try_timeout is "bounded by what is left of the deadline" anyway; a route that only shortens
    -- retry_timeout below the 10s default per_try_timeout should not be refused for a directive it never wrote
    it("accepts retry_timeout 5s alone (the default per_try_timeout is 10s)", function()
        local code, out = check({ "retry_timeout 5s;" })
        assert.equal(0, code, out)
    end)

    it("refuses a bad retry_on word", function()
        local code, out = check({ "retry_on 503 sometimes;" })
        assert_refused(code, out, { 6 }, "sometimes")
    end)
end)
