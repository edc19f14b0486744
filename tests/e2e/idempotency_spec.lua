-- The idempotency store end to end: the real binary (2 workers) in front of the fault upstream, with a real LMDB
-- file and a private redis-server. Every spec checks what the clients got and how often the upstream executed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local ctx = H.context

local I = require("idem_helpers")
local post, repeat_post = I.post, I.repeat_post
local function new_key() return I.new_key("key") end

-- Sends the same keyed POST on n connections at once, then reads every answer.
local function concurrent(ports, n, path, key, body)
    local conns = {}
    for i = 1, n do
        local port = ports[(i - 1) % #ports + 1]
        local c = assert(H.connect(port))
        conns[i] = c
        assert(c:send(H.build_request(port, { method = "POST", path = path, body = body,
            headers = { { "Idempotency-Key", key }, { "Content-Type", "application/json" } } })))
    end
    local out = {}
    for i, c in ipairs(conns) do
        out[i] = c:read_response({ timeout = 30 }) or { status = 0 }
        c:close()
    end
    return out
end

local problem_type = I.problem_type

local CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        idempotency_store lmdb:{{STORE}};
        location / { proxy_pass http://up; }
        location /required/ { idempotency_required on; proxy_pass http://up; }
        location /short/ { idempotency_ttl 3s; proxy_pass http://up; }
        location /small/ { idempotency_max_body 10; proxy_pass http://up; }
        location /lock/ { idempotency_lock_ttl 10s; retry_timeout 10s; proxy_pass http://up; }
        location /keyed/ { idempotency_key on; retry_attempts 3; proxy_pass http://up; }
        location /nostore/ { idempotency_store off; proxy_pass http://up; }
        location /sync/ { idempotency_sync on; proxy_pass http://up; }
    }
}
]]

describe("the LMDB idempotency store", function()
    local up, gw, dir, store

    local function start()
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { STORE = store } })
    end

    setup(function()
        up = H.start_upstream()
        dir = H.mkdtemp("idem")
        store = dir .. "/idem.mdb"
        start()
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function() up:reset() end)

    it("lets 10 concurrent duplicates over 2 workers reach the upstream once", function()
        -- the first answer takes 5 s: the nine others arrive while it is upstream, however busy the machine
        up:program({ default = { status = 201, body = '{"charged":true}', delay_ms = 5000 } })
        local key = new_key()
        local answers = concurrent({ gw.port }, 10, "/pay", key, '{"amount":10}')
        local by = {}
        for _, a in ipairs(answers) do by[tostring(a.status)] = (by[tostring(a.status)] or 0) + 1 end
        assert.equal(1, #up:hits(), ctx(gw))
        assert.equal(1, by["201"], ctx(gw, H.json.encode(by)))
        assert.equal(10, (by["201"] or 0) + (by["409"] or 0), ctx(gw, H.json.encode(by)))
        for _, a in ipairs(answers) do
            if a.status == 409 then
                assert.equal("application/problem+json", a.headers["content-type"])
                assert.equal("urn:ricochet:problem:idempotency-key-in-use", problem_type(a))
            end
        end
        -- afterwards every duplicate gets the stored answer, from either worker
        for _ = 1, 4 do
            local r = assert(repeat_post(gw.port, "/pay", key))
            assert.equal(201, r.status)
            assert.equal('{"charged":true}', r.body)
            assert.equal("true", r.headers["idempotent-replayed"])
        end
        assert.equal(1, #up:hits())
    end)

    it("replays the stored answer, fields and body, without a new execution", function()
        up:program({ default = { status = 201, headers = { ["X-Charge"] = "ch_1", ["Content-Type"] = "application/json" },
            body = '{"id":"ch_1"}' } })
        local key = new_key()
        local first = assert(post(gw.port, "/pay", key))
        assert.equal(201, first.status)
        assert.is_nil(first.headers["idempotent-replayed"])
        local again = assert(repeat_post(gw.port, "/pay", key))
        assert.equal(201, again.status, ctx(gw))
        assert.equal('{"id":"ch_1"}', again.body)
        assert.equal("ch_1", again.headers["x-charge"])
        assert.equal("application/json", again.headers["content-type"])
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        -- a chunked answer is kept decoded, and replayed with a length
        up:program({ default = { status = 200, body = H.body_of_size(3000), chunked = true, chunk_size = 700 } })
        local k2 = new_key()
        local c1 = assert(post(gw.port, "/pay", k2))
        local c2 = assert(repeat_post(gw.port, "/pay", k2))
        assert.equal(H.body_of_size(3000), c1.body)
        assert.equal(H.body_of_size(3000), c2.body, ctx(gw))
        assert.equal("3000", c2.headers["content-length"])
        assert.equal(2, #up:hits())
    end)

    it("answers 422 when the key comes back with another body, and 400 for two keys", function()
        local key = new_key()
        assert.equal(200, assert(post(gw.port, "/pay", key, '{"amount":10}')).status)
        local other = assert(post(gw.port, "/pay", key, '{"amount":99}'))
        assert.equal(422, other.status)
        assert.equal("urn:ricochet:problem:idempotency-key-reused", problem_type(other))
        local path = assert(post(gw.port, "/pay?x=1", key, '{"amount":10}'))
        assert.equal(422, path.status)
        local two = assert(H.request(gw.port, { method = "POST", path = "/pay", body = "{}",
            headers = { { "Idempotency-Key", "a" }, { "Idempotency-Key", "b" } } }))
        assert.equal(400, two.status)
        assert.equal(1, #up:hits())
    end)

    it("releases the key after a retryable failure, so the client may try again", function()
        up:program({ sequence = { 503 }, default = { status = 201, body = "done" } })
        local key = new_key()
        local r1 = assert(post(gw.port, "/pay", key))
        assert.equal(503, r1.status)
        local r2 = assert(repeat_post(gw.port, "/pay", key))
        assert.equal(201, r2.status, ctx(gw))
        assert.equal("done", r2.body)
        assert.equal(2, #up:hits())
        -- a gateway retry that mends it (idempotency_key on) keeps the final answer
        up:program({ sequence = { 503, 503 }, default = { status = 201, body = "mended" } })
        local k2 = new_key()
        assert.equal("mended", assert(post(gw.port, "/keyed/pay", k2)).body)
        local again = assert(repeat_post(gw.port, "/keyed/pay", k2))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(5, #up:hits())
        -- no answer at all (the upstream resets): released too
        up:program({ sequence = { { reset = "before_head" } }, default = { status = 201, body = "later" } })
        local k3 = new_key()
        assert.equal(502, assert(post(gw.port, "/pay", k3)).status)
        assert.equal("later", assert(repeat_post(gw.port, "/pay", k3)).body)
    end)

    it("keeps a 4xx answer: it is final", function()
        up:program({ default = { status = 402, body = "declined" } })
        local key = new_key()
        assert.equal(402, assert(post(gw.port, "/pay", key)).status)
        local again = assert(repeat_post(gw.port, "/pay", key))
        assert.equal(402, again.status)
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
    end)

    it("marks an answer larger than idempotency_max_body done, and says so with 409", function()
        up:program({ default = { status = 200, body = "more than ten bytes" } })
        local key = new_key()
        assert.equal("more than ten bytes", assert(post(gw.port, "/small/pay", key)).body)
        local again = assert(repeat_post(gw.port, "/small/pay", key))
        assert.equal(409, again.status, ctx(gw))
        assert.equal("urn:ricochet:problem:idempotency-answer-not-stored", problem_type(again))
        assert.equal(1, #up:hits())
    end)

    it("expires records after idempotency_ttl", function()
        local key = new_key()
        assert.equal(200, assert(post(gw.port, "/short/pay", key)).status)
        -- a 3 s ttl: the repeat comes within it on a busy machine too; past it, the record is gone
        assert.equal("true", assert(repeat_post(gw.port, "/short/pay", key)).headers["idempotent-replayed"])
        socket.sleep(3.5)
        local later = assert(post(gw.port, "/short/pay", key))
        assert.equal(200, later.status)
        assert.is_nil(later.headers["idempotent-replayed"], ctx(gw))
        assert.equal(2, #up:hits())
    end)

    it("answers 400 without a key where idempotency_required is on; safe methods need none", function()
        local r = assert(post(gw.port, "/required/pay", nil))
        assert.equal(400, r.status)
        assert.equal("urn:ricochet:problem:idempotency-key-missing", problem_type(r))
        assert.equal(200, assert(H.request(gw.port, { path = "/required/list" })).status)
        assert.equal(200, assert(post(gw.port, "/required/pay", new_key())).status)
        assert.equal(200, assert(post(gw.port, "/pay", nil)).status) -- not required there
        assert.equal(3, #up:hits())
    end)

    it("runs a slow payment once for a client that timed out and sent it twice more", function()
        -- the answer takes 5 s: the repeat comes while it is upstream, however busy the machine
        up:program({ default = { status = 201, body = "paid", delay_ms = 5000 } })
        local key = new_key()
        local c = assert(H.connect(gw.port))
        assert(c:send(H.build_request(gw.port, { method = "POST", path = "/pay", body = "{}",
            headers = { { "Idempotency-Key", key } } })))
        assert.equal(1, #up:wait_hits(1, 20), ctx(gw))
        c:close() -- the client gives up while the upstream works
        local r1 = assert(post(gw.port, "/pay", key, "{}"))
        assert.equal(409, r1.status)
        local done = H.wait_until(function()
            local r = post(gw.port, "/pay", key, "{}")
            return r and r.status == 201 and r
        end, 30)
        assert.truthy(done, ctx(gw))
        assert.equal("paid", done.body)
        assert.equal("true", done.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        -- a closed client looks like a half-closed one until a write to it fails: the access log has the
        -- status the answer was written with (its first write may still go into the closed socket), or 499
        local log = H.read_file(gw.prefix .. "/logs/access.log") or ""
        assert.truthy(log:find('"status":499[^\n]*"idempotency":"stored"')
            or log:find('"status":201[^\n]*"idempotency":"stored"'), ctx(gw, log))
    end)

    it("keeps stored answers across a restart of the gateway", function()
        up:program({ default = { status = 201, body = "before restart" } })
        local key = new_key()
        assert.equal(201, assert(post(gw.port, "/pay", key)).status)
        gw:stop()
        start()
        local r = assert(repeat_post(gw.port, "/pay", key))
        assert.equal("before restart", r.body, ctx(gw))
        assert.equal("true", r.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
    end)

    it("frees a key after its lock TTL when the gateway was killed with it in flight", function()
        -- a 10 s lock: the restart is done within it on a busy machine too; the kill comes before the
        -- answer (30 s)
        up:program({ sequence = { { status = 201, body = "lost", delay_ms = 30000 } }, default = { status = 201, body = "again" } })
        local key = new_key()
        local c = assert(H.connect(gw.port))
        assert(c:send(H.build_request(gw.port, { method = "POST", path = "/lock/pay", body = "{}",
            headers = { { "Idempotency-Key", key } } })))
        assert.equal(1, #up:wait_hits(1, 20), ctx(gw))
        for _, pid in ipairs(gw:workers()) do H.run({ "kill", "-9", tostring(pid) }) end
        gw:signal("KILL")
        gw:wait_exit(5)
        c:close()
        gw:stop()
        start()
        assert.equal(409, assert(post(gw.port, "/lock/pay", key, "{}")).status, ctx(gw))
        local r = H.wait_until(function()
            local x = post(gw.port, "/lock/pay", key, "{}")
            return x and x.status == 201 and x
        end, 30)
        assert.truthy(r, ctx(gw))
        assert.equal("again", r.body)
        assert.equal(2, #up:hits())
    end)

    it("flushes a claim to disk first with idempotency_sync on, and dedupes as ever", function()
        up:program({ default = { status = 201, body = "synced" } })
        local key = new_key()
        for _ = 1, 3 do
            local r = assert(repeat_post(gw.port, "/sync/pay", key))
            assert.equal(201, r.status, ctx(gw))
            assert.equal("synced", r.body)
        end
        assert.equal(1, #up:hits())
    end)

    it("leaves routes with idempotency_store off alone", function()
        local key = new_key()
        assert.equal(200, assert(post(gw.port, "/nostore/pay", key)).status)
        assert.equal(200, assert(post(gw.port, "/nostore/pay", key)).status)
        local two = assert(H.request(gw.port, { method = "POST", path = "/nostore/pay", body = "{}",
            headers = { { "Idempotency-Key", "a" }, { "Idempotency-Key", "b" } } }))
        assert.equal(200, two.status) -- the key is the upstream's business there
        assert.equal(3, #up:hits())
    end)

    it("finishes an answer its client stopped reading, then left", function()
        up:program({ default = { status = 200, body_size = 4 * 1024 * 1024 } })
        local key = new_key()
        local c = assert(H.connect(gw.port))
        assert(c:send(H.build_request(gw.port, { method = "POST", path = "/pay", body = "{}",
            headers = { { "Idempotency-Key", key } } })))
        assert.equal(1, #up:wait_hits(1, 20), ctx(gw))
        socket.sleep(0.3) -- the gateway is stuck on a client that reads nothing
        c:close() -- and that leaves, its answer unread (a reset; a half-close would be a client reading on)
        local r = H.wait_until(function()
            local x = post(gw.port, "/pay", key, "{}")
            return x and x.status == 409 and problem_type(x) == "urn:ricochet:problem:idempotency-answer-not-stored" and x
        end, 30)
        c:close()
        assert.truthy(r, ctx(gw, "the orphaned answer never finished"))
        assert.equal(1, #up:hits())
    end)
end)

local REDIS_CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        idempotency_store redis://127.0.0.1:{{REDIS}};
        location / { proxy_pass http://up; }
        location /open/ { idempotency_store_failure open; proxy_pass http://up; }
        location /db3/ { idempotency_store redis://127.0.0.1:{{REDIS}}/3; proxy_pass http://up; }
    }
}
]]

describe("the Redis idempotency store", function()
    local up, redis, gw1, gw2

    setup(function()
        up = H.start_upstream()
        redis = H.start_redis()
        gw1 = H.start_gateway({ conf = REDIS_CONF, upstream = up, vars = { REDIS = redis.port } })
        gw2 = H.start_gateway({ conf = REDIS_CONF, upstream = up, vars = { REDIS = redis.port } })
    end)

    teardown(function()
        if gw1 then gw1:stop() end
        if gw2 then gw2:stop() end
        if redis then redis:stop() end
        if up then up:stop() end
    end)

    before_each(function() up:reset() end)

    -- every worker of both gateways connected: a run of probes in a row all answered (a worker still in its
    -- reconnect backoff would answer 503)
    local function wait_redis_ready()
        local streak = 0
        return H.wait_until(function()
            local r = post(gw1.port, "/probe", new_key())
            local r2 = post(gw2.port, "/probe", new_key())
            streak = (r and r.status == 200 and r2 and r2.status == 200) and streak + 1 or 0
            return streak >= 8
        end, 30)
    end

    it("lets duplicates sent to two gateways at once reach the upstream once", function()
        assert.truthy(wait_redis_ready(), ctx(gw1))
        up:reset()
        -- the first answer takes 5 s: the nine others arrive while it is upstream, however busy the machine
        up:program({ default = { status = 201, body = "once", delay_ms = 5000 } })
        local key = new_key()
        local answers = concurrent({ gw1.port, gw2.port }, 10, "/pay", key, "{}")
        local by = {}
        for _, a in ipairs(answers) do by[tostring(a.status)] = (by[tostring(a.status)] or 0) + 1 end
        assert.equal(1, #up:hits(), ctx(gw1, H.json.encode(by)))
        assert.equal(1, by["201"], H.json.encode(by))
        assert.equal(9, by["409"], H.json.encode(by))
        local r1 = assert(repeat_post(gw1.port, "/pay", key, "{}"))
        local r2 = assert(repeat_post(gw2.port, "/pay", key, "{}"))
        assert.equal("once", r1.body)
        assert.equal("once", r2.body)
        assert.equal("true", r2.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        -- the records carry TTLs in Redis, and /DB selects another database
        local keys = redis:command("KEYS", "ricochet:idem:*")
        assert.is_true(type(keys) == "table" and #keys >= 1)
        local ttl = tonumber(redis:command("PTTL", keys[1]):match(":(%-?%d+)"))
        assert.is_true(ttl > 0 and ttl <= 24 * 3600 * 1000, tostring(ttl))
        up:program({ default = { status = 201, body = "once" } })
        assert.equal(201, assert(post(gw1.port, "/db3/pay", new_key(), "{}")).status)
        local _, out = H.run({ "redis-cli", "-p", tostring(redis.port), "-n", "3", "dbsize" })
        assert.equal("1", (out or ""):match("%d+"), out)
    end)

    it("answers 503 while Redis is down (closed), passes on where open, and reconnects by itself", function()
        assert.truthy(wait_redis_ready(), ctx(gw1))
        up:reset()
        redis:restart() -- Redis restarted mid-run: its data is gone, the gateways reconnect
        redis:terminate(3) -- and now it is down
        local down = H.wait_until(function()
            local r = post(gw1.port, "/pay", new_key(), "{}")
            return r and r.status == 503 and r
        end, 20)
        assert.truthy(down, ctx(gw1))
        assert.equal("application/problem+json", down.headers["content-type"])
        assert.equal("urn:ricochet:problem:idempotency-store-unavailable", problem_type(down))
        assert.equal(0, #up:hits())
        local key = new_key()
        assert.equal(200, assert(post(gw1.port, "/open/pay", key, "{}")).status)
        assert.equal(200, assert(post(gw1.port, "/open/pay", key, "{}")).status)
        assert.equal(2, #up:hits()) -- open: passed on without dedupe
        redis:restart()
        assert.truthy(wait_redis_ready(), ctx(gw1, "the gateways did not reconnect"))
        up:reset()
        local k2 = new_key()
        assert.equal(200, assert(post(gw1.port, "/pay", k2, "{}")).status)
        assert.equal("true", assert(repeat_post(gw2.port, "/pay", k2, "{}")).headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        local log = gw1:log()
        assert.truthy(log:find("connected again"), ctx(gw1))
    end)

    it("lets a key go that a stalled Redis locked after its claim was given up", function()
        assert.truthy(wait_redis_ready(), ctx(gw1))
        up:reset()
        local key = new_key()
        redis:signal("STOP") -- Redis hangs: claims wait 1 s, then 503
        local r = assert(post(gw1.port, "/pay", key, "{}"))
        assert.equal(503, r.status, ctx(gw1))
        for _ = 1, 3 do post(gw1.port, "/pay", new_key(), "{}") end -- enough for a worker to give up on it
        redis:signal("CONT") -- the claims it queued now run, and lock their keys
        assert.truthy(wait_redis_ready(), ctx(gw1))
        local later = H.wait_until(function()
            local x = post(gw1.port, "/pay", key, "{}")
            return x and x.status == 200 and x
        end, 30)
        assert.truthy(later, ctx(gw1, "the key stayed locked"))
        local n = 0
        for _, hit in ipairs(up:hits({ bodies = false })) do
            local v = H.hit_values(hit, "Idempotency-Key")
            if v[1] == key then n = n + 1 end
        end
        assert.equal(1, n) -- the stalled claim never reached the upstream; the re-send did, once
    end)

    it("settles the last answers before a stopping gateway exits", function()
        assert.truthy(wait_redis_ready(), ctx(gw1))
        up:reset()
        up:program({ default = { status = 201, body = "kept" } })
        local keys = {}
        for i = 1, 5 do
            keys[i] = new_key()
            assert.equal(201, assert(post(gw1.port, "/pay", keys[i], "{}")).status)
        end
        gw1:stop()
        for i = 1, 5 do
            local r = assert(repeat_post(gw2.port, "/pay", keys[i], "{}"))
            assert.equal("true", r.headers["idempotent-replayed"], ctx(gw2, "key " .. i))
        end
        assert.equal(5, #up:hits())
        gw1 = H.start_gateway({ conf = REDIS_CONF, upstream = up, vars = { REDIS = redis.port } })
    end)
end)

describe("a Redis that needs a password", function()
    local up, redis, gw, bad

    local AUTH_CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        idempotency_store redis://{{AUTH}}@127.0.0.1:{{REDIS}}/2;
        location / { proxy_pass http://up; }
    }
}
]]

    setup(function()
        up = H.start_upstream()
        redis = H.start_redis({ args = { "--requirepass", "s3cr%t@x" } })
        gw = H.start_gateway({ conf = AUTH_CONF, upstream = up, vars = { REDIS = redis.port, AUTH = ":s3cr%25t%40x" } })
        bad = H.start_gateway({ conf = AUTH_CONF, upstream = up, vars = { REDIS = redis.port, AUTH = ":wrong" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if bad then bad:stop() end
        if redis then redis:stop() end
        if up then up:stop() end
    end)

    it("authenticates (the password percent-decoded), and never shows the password", function()
        local key = new_key()
        local first = H.wait_until(function()
            local r = post(gw.port, "/pay", key, "{}")
            return r and r.status == 200 and r
        end, 20)
        assert.truthy(first, ctx(gw))
        assert.equal("true", repeat_post(gw.port, "/pay", key, "{}").headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
        local r = assert(post(bad.port, "/pay", new_key(), "{}"))
        assert.equal(503, r.status, ctx(bad))
        assert.equal(1, #up:hits())
        local log = bad:log()
        assert.truthy(log:find("authentication (AUTH) failed", 1, true), log)
        assert.truthy(log:find("redis://:***@127.0.0.1:", 1, true), log)
        assert.is_nil(log:find("wrong", 1, true), log)
        assert.is_nil(gw:log():find("s3cr", 1, true))
    end)
end)

describe("idempotency_store in the config", function()
    it("is shown by ricochet plan for each location that has one", function()
        local dir = H.mkdtemp("idemplan")
        H.write_file(dir .. "/plan.conf", ([[
http {
    upstream up { server 127.0.0.1:1; }
    server {
        listen 127.0.0.1:1;
        idempotency_store lmdb:%s/i.mdb;
        location /pay { idempotency_lock_ttl 90s; idempotency_store_failure open; proxy_pass http://up; }
        location /free { idempotency_store off; proxy_pass http://up; }
    }
}
]]):format(dir))
        local code, out = H.run({ H.bin(), "plan", "-c", dir .. "/plan.conf" })
        os.execute("rm -rf " .. H.shell_quote(dir))
        assert.equal(0, code, out)
        local pay = out:match("location /pay.-\n\n")
        assert.truthy(pay and pay:find("idempotency: keyed POST/PATCH deduped in lmdb:", 1, true), out)
        assert.truthy(pay:find("a lock lapses 90s after its gateway is gone; store unreachable: passed on without dedupe", 1, true), out)
        local free = out:match("location /free.-\n\n")
        assert.is_nil(free and free:find("idempotency:", 1, true), out)
    end)

    it("refuses an unusable LMDB path and a bad Redis URL with FILE:LINE", function()
        local conf = [[
http {
    server {
        listen 127.0.0.1:{{PORT}};
        location / { idempotency_store lmdb:/nonexistent/dir/idem.mdb; proxy_pass http://127.0.0.1:1; }
    }
}
]]
        local gw = H.start_gateway({ conf = conf, args = { "-t" }, wait = false })
        local code = gw:wait_exit(10)
        gw:stop()
        assert.is_not.equal(0, code)
        assert.truthy(gw:log():find("ricochet%.conf:4: idempotency store \"lmdb:/nonexistent/dir/idem.mdb\""), gw:log())
        local bad = H.start_gateway({ conf = conf:gsub("lmdb:/nonexistent/dir/idem.mdb", "redis://127.0.0.1:99999"),
            args = { "-t" }, wait = false })
        assert.is_not.equal(0, bad:wait_exit(10))
        bad:stop()
        assert.truthy(bad:log():find("ricochet%.conf:4: invalid \"redis://127.0.0.1:99999\""), bad:log())
    end)
end)
