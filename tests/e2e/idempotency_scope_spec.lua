-- Whose records a key reaches: two unnamed servers with the same location never share them, clients that sign
-- in by cookie each have their own, and a body's fingerprint is one whether it was held or streamed (across a
-- reload that moves retry_body_max). The real binary (2 workers) with a real LMDB file in front of two fault
-- upstreams; every spec counts how often each upstream executed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local ctx = H.context

local I = require("idem_helpers")
local post, repeat_post = I.post, I.repeat_post
local function new_key() return I.new_key("scope") end

-- Two servers with no server_name, each on its own port, with the same location proxying to different upstreams;
-- the first has the cookie and fingerprint routes too. MAX is retry_body_max (a reload changes it).
local CONF = [[
worker_processes 2;
pid logs/ricochet.pid;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    idempotency_store lmdb:{{STORE}};
    retry_backoff 1ms 2ms;
    retry_body_max {{MAX}};
    server {
        listen 127.0.0.1:{{PORT}};
        location /pay/ { proxy_pass http://{{UPSTREAM1}}; }
        location /session/ { proxy_pass http://{{UPSTREAM1}}; }
        location /upload/ { proxy_pass http://{{UPSTREAM1}}; }
    }
    server {
        listen 127.0.0.1:{{PORT2}};
        location /pay/ { proxy_pass http://{{UPSTREAM2}}; }
    }
}
]]

local function replayed(resp) return resp.headers["idempotent-replayed"] == "true" end

describe("the record key", function()
    local up1, up2, gw, dir

    setup(function()
        up1 = H.start_upstream()
        up2 = H.start_upstream()
        dir = H.mkdtemp("idemscope")
        gw = H.start_gateway({ conf = CONF, upstreams = { up1, up2 },
            vars = { STORE = dir .. "/idem.mdb", MAX = "64k" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up1 then up1:stop() end
        if up2 then up2:stop() end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    before_each(function()
        up1:reset()
        up2:reset()
        up1:program({ default = { status = 200, body = '{"charged":"A"}' } })
        up2:program({ default = { status = 200, body = '{"charged":"B"}' } })
    end)

    -- the same config again, or with another retry_body_max
    local function reload(max)
        local code, out
        if max then
            code, out = gw:reload(CONF, { MAX = max })
        else
            code, out = gw:reload()
        end
        assert.equal(0, code, ctx(gw, "reload: " .. tostring(out)))
    end

    it("of an unnamed server never reaches another's with the same location, across a reload", function()
        local key = new_key()
        local a = assert(post(gw.port, "/pay/charge", key))
        assert.equal(200, a.status, ctx(gw))
        assert.equal('{"charged":"A"}', a.body)
        local b = assert(repeat_post(gw.port2, "/pay/charge", key))
        assert.equal(200, b.status, ctx(gw))
        assert.is_false(replayed(b), ctx(gw, "server B replayed server A's answer"))
        assert.equal('{"charged":"B"}', b.body, ctx(gw))
        assert.equal(1, #up1:hits(), ctx(gw))
        assert.equal(1, #up2:hits(), ctx(gw, "server B's upstream never ran"))

        -- each keeps its own record, through a reload
        reload()
        for _, side in ipairs({ { gw.port, "A" }, { gw.port2, "B" } }) do
            local again = assert(repeat_post(side[1], "/pay/charge", key))
            assert.equal(200, again.status, ctx(gw, side[2]))
            assert.is_true(replayed(again), ctx(gw, side[2] .. " after the reload was not replayed"))
            assert.equal('{"charged":"' .. side[2] .. '"}', again.body, ctx(gw, side[2]))
        end
        assert.equal(1, #up1:hits(), ctx(gw))
        assert.equal(1, #up2:hits(), ctx(gw))
    end)

    it("shows what keys a route's records in ricochet plan", function()
        local code, out = H.run({ H.bin(), "plan", "-p", gw.prefix, "-c", gw.conf_path })
        assert.equal(0, code, out)
        local a = ("listen 127.0.0.1:%d (another route has"):format(gw.port)
        local b = ("listen 127.0.0.1:%d (another route has"):format(gw.port2)
        assert.truthy(out:find('idempotency records keyed by: server_name "", location /pay/, ' .. a, 1, true), out)
        assert.truthy(out:find('idempotency records keyed by: server_name "", location /pay/, ' .. b, 1, true), out)
        -- a route nothing shares its name and location with keeps the key it always had
        assert.truthy(out:find('idempotency records keyed by: server_name "", location /session/; ', 1, true), out)
    end)

    it("of a client that signs in by cookie is its own, its Set-Cookie too", function()
        up1:program({ sequence = {
            { status = 200, headers = { ["Set-Cookie"] = "s=a2; Path=/" }, body = "for a" },
            { status = 200, headers = { ["Set-Cookie"] = "s=b2; Path=/" }, body = "for b" },
        }, default = { status = 200, body = "for another" } })
        local key = new_key()
        local a = assert(post(gw.port, "/session/checkout", key, nil, { { "Cookie", "s=a" } }))
        assert.equal("for a", a.body, ctx(gw))
        local b = assert(repeat_post(gw.port, "/session/checkout", key, nil, { { "Cookie", "s=b" } }))
        assert.is_false(replayed(b), ctx(gw, "client B got client A's answer"))
        assert.equal("for b", b.body, ctx(gw))
        assert.equal("s=b2; Path=/", b.headers["set-cookie"], ctx(gw))
        assert.equal(2, #up1:hits(), ctx(gw))
        for _, c in ipairs({ { "s=a", "for a", "s=a2; Path=/" }, { "s=b", "for b", "s=b2; Path=/" } }) do
            local again = assert(repeat_post(gw.port, "/session/checkout", key, nil, { { "Cookie", c[1] } }))
            assert.is_true(replayed(again), ctx(gw, c[1] .. " was not replayed"))
            assert.equal(c[2], again.body, ctx(gw, c[1]))
            assert.equal(c[3], again.headers["set-cookie"], ctx(gw, c[1]))
        end
        -- every Cookie field counts, in order: one more field is another client
        local more = assert(repeat_post(gw.port, "/session/checkout", key, nil,
            { { "Cookie", "s=a" }, { "Cookie", "t=1" } }))
        assert.is_false(replayed(more), ctx(gw, "a client with other cookies got client A's answer"))
        assert.equal(3, #up1:hits(), ctx(gw))
        -- beside an Authorization, cookies are not the scope: a changed one is the same client
        local key2 = new_key()
        assert.equal(200, assert(post(gw.port, "/session/checkout", key2, nil,
            { { "Authorization", "Bearer t1" }, { "Cookie", "s=a" } })).status, ctx(gw))
        local same = assert(repeat_post(gw.port, "/session/checkout", key2, nil,
            { { "Authorization", "Bearer t1" }, { "Cookie", "s=changed" } }))
        assert.is_true(replayed(same), ctx(gw, "a changed cookie beside the same Authorization ran again"))
        assert.equal(4, #up1:hits(), ctx(gw))
    end)

    -- A body of 8 KiB: held under retry_body_max 64k, streamed under 1k.
    local BODY = H.text_body(8192, 7)

    local function send(key, chunked, body)
        return H.request(gw.port, { method = "POST", path = "/upload/file", body = body or BODY, chunked = chunked,
            chunk_size = 1000, headers = { { "Idempotency-Key", key }, { "Content-Type", "text/plain" } } })
    end

    -- send, then the same until it is no longer in flight (as repeat_post)
    local function send_again(key, chunked, body)
        local last
        H.wait_until(function()
            last = send(key, chunked, body)
            return not (last and last.status == 409 and last.body:find("idempotency-key-in-use", 1, true))
        end, 15)
        return last
    end

    local function assert_one_fingerprint(first_max, then_max)
        reload(first_max)
        local k_len, k_chunked = new_key(), new_key()
        assert.equal(200, assert(send(k_len, false)).status, ctx(gw))
        assert.equal(200, assert(send_again(k_chunked, true)).status, ctx(gw))
        -- the same bytes in the other framing, under the same retry_body_max
        for _, t in ipairs({ { k_len, true }, { k_chunked, false } }) do
            local again = assert(send_again(t[1], t[2]))
            assert.equal(200, again.status, ctx(gw, "other framing: " .. tostring(again.body)))
            assert.is_true(replayed(again), ctx(gw, "other framing was not replayed"))
        end
        -- the other retry_body_max, both framings
        reload(then_max)
        for _, t in ipairs({ { k_len, false }, { k_len, true }, { k_chunked, true }, { k_chunked, false } }) do
            local again = assert(send_again(t[1], t[2]))
            assert.equal(200, again.status, ctx(gw, ("retry_body_max %s -> %s, chunked %s: %s"):format(
                first_max, then_max, tostring(t[2]), tostring(again.body))))
            assert.is_true(replayed(again), ctx(gw))
        end
        -- another body under the same key is still another request, held or streamed
        for _, chunked in ipairs({ false, true }) do
            local other = assert(send_again(k_len, chunked, H.text_body(8192, 8)))
            assert.equal(422, other.status, ctx(gw, "another body, chunked " .. tostring(chunked)))
        end
        assert.equal(2, #up1:hits(), ctx(gw))
    end

    it("fingerprints a held body and the same body streamed alike (held first)", function()
        assert_one_fingerprint("64k", "1k")
    end)

    it("fingerprints a streamed body and the same body held alike (streamed first)", function()
        assert_one_fingerprint("1k", "64k")
    end)
end)
