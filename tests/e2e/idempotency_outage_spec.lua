-- The idempotency store when things go wrong under a keyed request: Redis goes away while the request is upstream
-- (its settle must wait for Redis and be applied when it is back), and bodies streamed past retry_body_max (their
-- fingerprint is the digest of their bytes, whatever their size or framing). The real binary in front of the fault
-- upstream, with a private redis-server that keeps its data (AOF) or a real LMDB file. Every spec checks what the
-- clients got and how often the upstream executed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local I = require("idem_helpers")
local problem_type = I.problem_type
local function new_key() return I.new_key("outage") end

local function is_in_use(r)
    return r and r.status == 409 and problem_type(r) == "urn:ricochet:problem:idempotency-key-in-use"
end

local function is_store_down(r)
    return r and r.status == 503 and problem_type(r) == "urn:ricochet:problem:idempotency-store-unavailable"
end

-- A keyed POST as bytes: opts.chunked sends the body with Transfer-Encoding: chunked (opts.chunk_size), otherwise
-- with Content-Length.
local function keyed_request(port, path, key, body, opts)
    opts = opts or {}
    local headers = { { "Content-Type", "application/octet-stream" } }
    if key then headers[#headers + 1] = { "Idempotency-Key", key } end
    return H.build_request(port, { method = "POST", path = path, headers = headers, body = body,
        chunked = opts.chunked, chunk_size = opts.chunk_size })
end

-- One keyed POST on its own connection (or opts.conn, kept open); the answer, or nil + error.
local function post(port, path, key, body, opts)
    opts = opts or {}
    local c = opts.conn
    if not c then
        local err
        c, err = H.connect(port)
        if not c then return nil, err end
    end
    local ok, err = c:send(keyed_request(port, path, key, body, opts), 30)
    local resp
    if ok then resp, err = c:read_response({ timeout = opts.timeout or 10 }) end
    if not opts.conn then c:close() end
    return resp, err
end

-- A repeat of a request that has just been answered: the store is written a moment after the client got its
-- answer, so a repeat sent at once may still find the key in use (409). It retries that, briefly.
local function repeat_post(port, path, key, body, opts)
    local last
    H.wait_until(function()
        last = post(port, path, key, body, opts)
        return not is_in_use(last)
    end, 15)
    return last
end

-- "503 x12, 409 x3, 201 x1": what a poll saw, in order
local function runs(list)
    local out, i = {}, 1
    while i <= #list do
        local j = i
        while j < #list and list[j + 1] == list[i] do j = j + 1 end
        out[#out + 1] = ("%s x%d"):format(tostring(list[i]), j - i + 1)
        i = j + 1
    end
    return table.concat(out, ", ")
end

---------------------------------------------------------------------------
-- A. Redis goes away while a keyed request is upstream
---------------------------------------------------------------------------

local REDIS_CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        idempotency_store redis://127.0.0.1:{{REDIS}};
        idempotency_lock_ttl 30s;
        location / { proxy_pass http://up; }
        location /once/ { retry_attempts 1; proxy_pass http://up; }
    }
}
]]

describe("a keyed request whose answer arrives while Redis is down", function()
    local up, redis, gw

    setup(function()
        up = H.start_upstream()
        -- Redis keeps what it is told (every write flushed to its AOF in its own temp dir), so the claim made
        -- before it went down is still there when it comes back: just as a production Redis with persistence
        redis = H.start_redis({ args = { "--appendonly", "yes", "--appendfsync", "always" } })
        gw = H.start_gateway({ conf = REDIS_CONF, upstream = up, vars = { REDIS = redis.port } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if redis then redis:stop() end
        if up then up:stop() end
    end)

    before_each(function() up:reset() end)

    -- the worker is connected: a run of keyed probes in a row all answered (one in its reconnect backoff
    -- would answer 503)
    local function wait_redis_ready()
        local streak = 0
        up:reset()
        local ok = H.wait_until(function()
            local r = post(gw.port, "/probe", new_key(), "{}")
            streak = (r and r.status == 200) and streak + 1 or 0
            return streak >= 5
        end, 30)
        up:reset()
        return ok
    end

    -- Sends a keyed POST on its own connection, waits until the upstream has it, takes Redis down (its data
    -- stays in its dir), then reads the client's answer; Redis is started again on the same port and dir.
    local function answer_during_outage(path, key, body)
        local c = assert(H.connect(gw.port))
        assert(c:send(keyed_request(gw.port, path, key, body)))
        local reached = H.wait_until(function() return #up:hits({ bodies = false }) == 1 end, 20)
        assert.truthy(reached, ctx(gw, "the keyed request never reached the upstream"))
        redis:terminate(3) -- down; unlike :stop() this keeps its dir (the AOF) for :restart()
        assert.is_false(redis:alive())
        local first = c:read_response({ timeout = 30 })
        c:close()
        redis:restart()
        return first
    end

    it("keeps the answer and replays it once Redis is back, without a second execution", function()
        assert.truthy(wait_redis_ready(), ctx(gw, "the gateway never connected to Redis"))
        -- the answer takes 6 s: Redis is down before it comes, however busy the machine
        up:program({ default = { status = 201, body = '{"charged":1}', delay_ms = 6000 } })
        local key = new_key()
        local first = answer_during_outage("/pay", key, '{"amount":10}')
        assert.truthy(first, ctx(gw, "no answer for the request in flight"))
        assert.equal(201, first.status, ctx(gw))
        assert.equal('{"charged":1}', first.body)
        assert.is_nil(first.headers["idempotent-replayed"])
        -- the gateway reconnects (backoff up to 5 s), applies the settle it kept, and the key is complete
        local seen = {}
        local again = H.wait_until(function()
            local r = post(gw.port, "/pay", key, '{"amount":10}')
            seen[#seen + 1] = r and r.status or "none"
            if is_in_use(r) or is_store_down(r) then
                H.sleep(0.1) -- paced: the gateway logs each 503
                return nil
            end
            return r or nil
        end, 30)
        local summary = "repeat statuses: " .. runs(seen)
        assert.truthy(again, ctx(gw, summary))
        assert.equal(201, again.status, ctx(gw, summary .. "\n" .. again.body))
        assert.equal('{"charged":1}', again.body, ctx(gw, summary))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw, summary))
        assert.equal(1, #up:hits({ bodies = false }), ctx(gw, summary))
        -- and it stays so
        local later = assert(post(gw.port, "/pay", key, '{"amount":10}'))
        assert.equal("true", later.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits({ bodies = false }))
        assert.truthy(gw:log():find("settles wait for Redis to come back", 1, true), ctx(gw))
    end)

    it("applies a release made while Redis was down, so a repeat reaches the upstream again", function()
        assert.truthy(wait_redis_ready(), ctx(gw, "the gateway never connected to Redis again"))
        up:program({ sequence = { { status = 503, body = "busy", delay_ms = 6000 } },
            default = { status = 201, body = '{"charged":2}' } })
        local key = new_key()
        local first = answer_during_outage("/once/pay", key, '{"amount":20}')
        assert.truthy(first, ctx(gw, "no answer for the request in flight"))
        assert.equal(503, first.status, ctx(gw))
        assert.equal("busy", first.body, ctx(gw))
        assert.equal(1, #up:hits({ bodies = false }))
        -- the 503 freed the key: once the release reaches Redis the repeat runs, long before the 30 s lock TTL
        local seen = {}
        local again = H.wait_until(function()
            local r = post(gw.port, "/once/pay", key, '{"amount":20}')
            seen[#seen + 1] = r and r.status or "none"
            if is_in_use(r) or is_store_down(r) then
                H.sleep(0.1) -- paced: the gateway logs each 503
                return nil
            end
            return r or nil
        end, 30)
        local summary = "repeat statuses: " .. runs(seen)
        assert.truthy(again, ctx(gw, summary))
        assert.equal(201, again.status, ctx(gw, summary .. "\n" .. again.body))
        assert.equal('{"charged":2}', again.body)
        assert.is_nil(again.headers["idempotent-replayed"], ctx(gw, summary))
        assert.equal(2, #up:hits({ bodies = false }), ctx(gw, summary))
        -- the new answer is kept as usual
        local replay = assert(repeat_post(gw.port, "/once/pay", key, '{"amount":20}'))
        assert.equal('{"charged":2}', replay.body, ctx(gw))
        assert.equal("true", replay.headers["idempotent-replayed"], ctx(gw))
        assert.equal(2, #up:hits({ bodies = false }))
    end)
end)

---------------------------------------------------------------------------
-- B. Bodies larger than retry_body_max, streamed through
---------------------------------------------------------------------------

local LMDB_CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        retry_body_max 1k;
        client_max_body_size 10m;
        # streaming 2 MiB through the gateway to the Lua upstream took over 10 s (the default
        # per_try_timeout) on a busy machine: these specs are about what is held, not how fast
        retry_timeout 120s;
        per_try_timeout 120s;
        idempotency_store lmdb:{{STORE}};
        location / { proxy_pass http://up; }
    }
}
]]

describe("a keyed request with a streamed body (larger than retry_body_max)", function()
    local up, gw, dir

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("idemout")
        gw = H.start_gateway({ conf = LMDB_CONF, upstream = up, vars = { STORE = dir .. "/idem.mdb" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function() up:reset() end)

    local function hits() return up:hits({ bodies = false }) end

    it("streams a chunked body that outgrew retry_body_max after the route waited for more of it", function()
        -- held while short, then past retry_body_max: it streams from there on, while the key is held
        up:program({ default = { status = 201, body = "ok" } })
        local c = assert(H.connect(gw.port))
        assert(c:send("POST /grow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " .. new_key() .. "\r\n"
            .. "Transfer-Encoding: chunked\r\n\r\n64\r\n" .. ("a"):rep(100) .. "\r\n"))
        H.sleep(0.2) -- the body phase waits for more
        local piece = ("4000\r\n%s\r\n"):format(("b"):rep(16384))
        for _ = 1, 128 do -- 2 MiB: far past what the upload stage holds before the client must wait
            assert(c:send(piece, 30), ctx(gw, "the gateway stopped reading the body"))
        end
        assert(c:send("0\r\n\r\n", 30))
        local resp = c:read_response({ timeout = 60 })
        c:close()
        assert.truthy(resp, ctx(gw))
        assert.equal(201, resp.status)
        local h = hits()
        assert.equal(1, #h, ctx(gw))
        assert.equal(100 + 128 * 16384, h[1].body_len)
    end)

    it("answers 422 for another chunked body under the key, and replays the same bytes in either framing", function()
        up:program({ default = { status = 200, body = '{"stored":"3k"}' } })
        local key = new_key()
        local body = H.text_body(3000, 1)
        local first = assert(post(gw.port, "/upload", key, body, { chunked = true, chunk_size = 700 }))
        assert.equal(200, first.status, ctx(gw))
        assert.equal('{"stored":"3k"}', first.body)
        local h = up:hits()
        assert.equal(1, #h, ctx(gw))
        assert.equal(3000, h[1].body_len)
        assert.equal(body, h[1].body) -- passed on whole
        -- another body (5,000 other bytes, chunked) under the key
        local other = assert(repeat_post(gw.port, "/upload", key, H.text_body(5000, 2), { chunked = true, chunk_size = 700 }))
        assert.equal(422, other.status, ctx(gw, other.body))
        assert.equal("application/problem+json", other.headers["content-type"])
        assert.equal("urn:ricochet:problem:idempotency-key-reused", problem_type(other))
        assert.equal(1, #hits())
        -- the same 3,000 bytes, chunked again (in other chunk sizes)
        local same = assert(repeat_post(gw.port, "/upload", key, body, { chunked = true, chunk_size = 1024 }))
        assert.equal(200, same.status, ctx(gw, same.body))
        assert.equal('{"stored":"3k"}', same.body)
        assert.equal("true", same.headers["idempotent-replayed"], ctx(gw))
        -- and with Content-Length: the fingerprint is the bytes' digest, whatever the framing
        local framed = assert(repeat_post(gw.port, "/upload", key, body))
        assert.equal(200, framed.status, ctx(gw, framed.body))
        assert.equal('{"stored":"3k"}', framed.body)
        assert.equal("true", framed.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #hits())
    end)

    it("tells 2 MB bodies apart by their last byte, replays the same one, and keeps the connection", function()
        up:program({ default = { status = 200, body = '{"stored":"2m"}' } })
        local n = 2 * 1024 * 1024
        local key = new_key()
        local body = H.text_body(n, 3)
        local last = body:sub(-1)
        local other = body:sub(1, -2) .. (last == "A" and "B" or "A")
        local first = assert(post(gw.port, "/upload", key, body, { timeout = 60 }))
        assert.equal(200, first.status, ctx(gw))
        local h = hits()
        assert.equal(1, #h, ctx(gw))
        assert.equal(n, h[1].body_len)
        local r422 = assert(repeat_post(gw.port, "/upload", key, other, { timeout = 60 }))
        assert.equal(422, r422.status, ctx(gw, r422.body))
        assert.equal("urn:ricochet:problem:idempotency-key-reused", problem_type(r422))
        assert.equal(1, #hits())
        -- the same 2 MB on a keep-alive connection: the stored answer, and the connection goes on
        local c = assert(H.connect(gw.port))
        local replay = assert(post(gw.port, "/upload", key, body, { conn = c, timeout = 60 }))
        assert.equal(200, replay.status, ctx(gw, replay.body))
        assert.equal('{"stored":"2m"}', replay.body)
        assert.equal("true", replay.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #hits())
        up:program({ default = { status = 200, body = "after the replay" } })
        local get, err = c:request({ method = "GET", path = "/status", timeout = 10 })
        c:close()
        assert.truthy(get, ctx(gw, "the connection after the replay: " .. tostring(err)))
        assert.equal(200, get.status, ctx(gw))
        assert.equal("after the replay", get.body)
        h = hits()
        assert.equal(2, #h)
        assert.equal("GET", h[2].method)
    end)

    it("answers 409 in use to a repeat while the first streamed request is still upstream", function()
        -- the first answer takes 8 s: the repeat comes while it is upstream however busy the machine
        up:program({ default = { status = 201, body = '{"stored":"slow"}', delay_ms = 8000 } })
        local key = new_key()
        local body = H.text_body(3000, 4)
        local c = assert(H.connect(gw.port))
        assert(c:send(keyed_request(gw.port, "/upload", key, body, { chunked = true, chunk_size = 700 })))
        local reached = H.wait_until(function() return #hits() == 1 end, 20)
        assert.truthy(reached, ctx(gw, "the first request never reached the upstream"))
        local dup = assert(post(gw.port, "/upload", key, body, { chunked = true, chunk_size = 700 }))
        assert.equal(409, dup.status, ctx(gw, dup.body))
        assert.equal("application/problem+json", dup.headers["content-type"])
        assert.equal("urn:ricochet:problem:idempotency-key-in-use", problem_type(dup))
        local first = c:read_response({ timeout = 30 })
        c:close()
        assert.truthy(first, ctx(gw, "no answer for the first request"))
        assert.equal(201, first.status, ctx(gw))
        assert.equal('{"stored":"slow"}', first.body)
        assert.equal(1, #hits())
        -- once it is done, the repeat gets its answer
        local replay = assert(repeat_post(gw.port, "/upload", key, body, { chunked = true, chunk_size = 700 }))
        assert.equal(201, replay.status, ctx(gw, replay.body))
        assert.equal("true", replay.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #hits())
    end)
end)
