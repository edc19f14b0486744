-- Exercises the fault upstream and the e2e helpers directly, so gateway specs can trust both.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

describe("fault upstream", function()
    local up

    setup(function()
        up = H.start_upstream()
    end)

    teardown(function()
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
    end)

    it("prints its port and answers 200 ok by default", function()
        assert.is_number(up.port)
        local resp = assert(H.request(up.port, { path = "/x" }))
        assert.equal(200, resp.status)
        assert.equal("ok\n", resp.body)
        assert.equal("1", resp.headers["x-fault-hit"])
    end)

    it("plays a programmed sequence, then the default", function()
        up:program({ sequence = { { status = 503 }, { status = 503 }, { status = 200, body = "fine" } } })
        local got = {}
        for i = 1, 4 do
            local resp = assert(H.request(up.port, { path = "/seq" }))
            got[i] = resp.status
        end
        assert.same({ 503, 503, 200, 200 }, got)
        local hits = up:hits()
        assert.equal(4, #hits)
        for i, hit in ipairs(hits) do assert.equal(i, hit.n) end
    end)

    it("keeps per-route sequences apart from the global one", function()
        up:program({
            sequence = { 500 },
            routes = { ["/a"] = { sequence = { 502, 504 }, default = { status = 201 } } },
        })
        assert.equal(502, H.request(up.port, { path = "/a" }).status)
        assert.equal(500, H.request(up.port, { path = "/b" }).status)
        assert.equal(504, H.request(up.port, { path = "/a?q=1" }).status)
        assert.equal(201, H.request(up.port, { path = "/a" }).status)
        assert.equal(200, H.request(up.port, { path = "/b" }).status)
    end)

    it("records method, target, headers and a Content-Length body", function()
        local resp = assert(H.request(up.port, {
            method = "POST", path = "/up?x=1",
            headers = { { "X-Dup", "1" }, { "x-dup", "2" }, { "Content-Type", "text/plain" } },
            body = "hello body",
        }))
        assert.equal(200, resp.status)
        local hit = up:hits()[1]
        assert.equal("POST", hit.method)
        assert.equal("/up?x=1", hit.target)
        assert.equal("/up", hit.path)
        assert.equal("HTTP/1.1", hit.version)
        assert.equal("hello body", hit.body)
        assert.equal(10, hit.body_len)
        assert.is_false(hit.chunked)
        assert.same({ "Host", "127.0.0.1:" .. up.port }, hit.headers[1])
        assert.same({ "X-Dup", "1" }, hit.headers[2])
        assert.same({ "x-dup", "2" }, hit.headers[3])
        assert.equal("2", hit.header_map["x-dup"])
        assert.equal("10", hit.header_map["content-length"])
        assert.is_number(hit.time)
        assert.is_number(hit.conn)
    end)

    it("decodes and records a chunked request body", function()
        local body = ("chunked-data-"):rep(50)
        assert(H.request(up.port, { method = "POST", path = "/c", body = body, chunked = true, chunk_size = 7 }))
        local hit = up:hits()[1]
        assert.is_true(hit.chunked)
        assert.equal(body, hit.body)
        assert.equal(#body, hit.body_len)
        assert.equal("chunked", hit.header_map["transfer-encoding"])
    end)

    it("keeps binary request bodies intact and adds body_hex", function()
        local body = "\0\1\2\255\254\128 bin"
        assert(H.request(up.port, { method = "PUT", path = "/bin", body = body }))
        local hit = up:hits()[1]
        assert.equal(body, hit.body)
        assert.equal("000102fffe802062696e", hit.body_hex)
    end)

    it("sends a 64 KiB generated body intact", function()
        up:program({ default = { body_size = 65536 } })
        local resp = assert(H.request(up.port, { path = "/big" }))
        assert.equal("65536", resp.headers["content-length"])
        assert.equal(65536, #resp.body)
        assert.equal(H.body_of_size(65536), resp.body)
    end)

    it("sends a chunked response that H.request decodes", function()
        up:program({ default = { body_size = 10000, chunked = true, chunk_size = 1000,
            trailers = { { "X-Trailer", "t" } } } })
        local resp = assert(H.request(up.port, { path = "/chunked" }))
        assert.is_true(resp.chunked)
        assert.equal("chunked", resp.headers["transfer-encoding"])
        assert.is_nil(resp.headers["content-length"])
        assert.equal(H.body_of_size(10000), resp.body)
        assert.same({ { "X-Trailer", "t" } }, resp.trailers)
    end)

    it("answers HEAD with headers only", function()
        up:program({ default = { body = "12345" } })
        local conn = assert(H.connect(up.port))
        local resp = assert(conn:request({ method = "HEAD", path = "/h" }))
        assert.equal("5", resp.headers["content-length"])
        assert.equal("", resp.body)
        -- nothing extra may follow: the next response must parse cleanly
        local resp2 = assert(conn:request({ path = "/h" }))
        assert.equal("12345", resp2.body)
        conn:close()
    end)

    it("sends duplicate headers, custom reason and echo bodies", function()
        up:program({ default = { status = 299, reason = "Fine Thanks", echo = true,
            headers = { { "Set-Cookie", "a=1" }, { "Set-Cookie", "b=2" } } } })
        local resp = assert(H.request(up.port, { method = "POST", path = "/echo", body = "xyz" }))
        assert.equal(299, resp.status)
        assert.equal("Fine Thanks", resp.reason)
        assert.same({ "a=1", "b=2" }, H.header_values(resp, "set-cookie"))
        local rec = H.json.decode(resp.body)
        assert.equal("/echo", rec.path)
        assert.equal("xyz", rec.body)
    end)

    it("turns reset before_head into a connection error", function()
        up:program({ default = { reset = "before_head" } })
        local resp, err = H.request(up.port, { path = "/rst" })
        assert.is_nil(resp)
        assert.equal("reset", err)
        assert.equal(1, up:stats().hits)
    end)

    it("cuts a response mid-body with reset mid_body", function()
        up:program({ default = { body_size = 1000, reset = "mid_body" } })
        local resp, err, partial = H.request(up.port, { path = "/mid" })
        assert.is_nil(resp)
        assert.equal("reset", err)
        assert.equal(200, partial.status)
        assert.equal(H.body_of_size(500), partial.body)
    end)

    it("does not let a delayed answer block another connection", function()
        up:program({ routes = { ["/slow"] = { default = { delay_ms = 800, body = "slow" } } } })
        local slow = assert(H.connect(up.port))
        assert(slow:send(H.build_request(up.port, { path = "/slow" })))
        local fast = assert(H.request(up.port, { path = "/fast" }))
        assert.equal("ok\n", fast.body)
        local resp = assert(slow:read_response())
        assert.equal("slow", resp.body)
        slow:close()
    end)

    it("reuses a keep-alive connection", function()
        local conn = assert(H.connect(up.port))
        assert.equal(200, assert(conn:request({ path = "/k1" })).status)
        assert.equal(200, assert(conn:request({ path = "/k2" })).status)
        assert.is_false(conn:closed(0.2))
        local stats = up:stats()
        assert.equal(2, stats.hits)
        assert.equal(1, stats.connections)
        assert.equal(1, stats.open_connections)
        local hits = up:hits()
        assert.equal(hits[1].conn, hits[2].conn)
        conn:close()
        assert.truthy(H.wait_until(function() return up:stats().open_connections == 0 end, 15))
    end)

    it("answers pipelined requests in order", function()
        up:program({ sequence = { { body = "one", delay_ms = 100 }, { body = "two" }, { body = "three" } } })
        local req = H.build_request(up.port, { path = "/1" }) .. H.build_request(up.port, { method = "HEAD", path = "/2" })
            .. H.build_request(up.port, { path = "/3", headers = { Connection = "close" } })
        local data, closed = H.raw(up.port, req)
        assert.is_true(closed)
        local list = H.parse_responses(data, { methods = { "GET", "HEAD", "GET" } })
        assert.equal(3, #list)
        assert.equal("one", list[1].body)
        assert.equal("", list[2].body)
        assert.equal("three", list[3].body)
        assert.equal("close", list[3].headers["connection"])
    end)

    it("closes after close = true and for HTTP/1.0", function()
        up:program({ sequence = { { close = true } } })
        local conn = assert(H.connect(up.port))
        local resp = assert(conn:request({ path = "/c" }))
        assert.equal("close", resp.headers["connection"])
        local closed, how = conn:closed(10)
        assert.is_true(closed)
        assert.equal("closed", how)
        conn:close()
        local data, closed = H.raw(up.port, "GET /old HTTP/1.0\r\n\r\n")
        assert.is_true(closed)
        assert.matches("^HTTP/1%.1 200 OK\r\n", data)
    end)

    it("sends raw bytes verbatim", function()
        local bytes = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"
        up:program({ default = { raw = bytes, close = true } })
        local data, closed = H.raw(up.port, "GET /raw HTTP/1.1\r\nHost: x\r\n\r\n")
        assert.equal(bytes, data)
        assert.is_true(closed)
    end)

    it("stays silent when told to", function()
        up:program({ default = { silent = true } })
        local data, closed = H.raw(up.port, "GET /s HTTP/1.1\r\nHost: x\r\n\r\n", { timeout = 0.3 })
        assert.equal("", data)
        assert.is_false(closed)
    end)

    it("answers malformed requests with 400 and closes", function()
        local data, closed = H.raw(up.port, "NOT A REQUEST\r\n\r\n")
        assert.matches("^HTTP/1%.1 400 ", data)
        assert.is_true(closed)
        local data2 = H.raw(up.port, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n")
        assert.matches("^HTTP/1%.1 400 ", data2)
        -- and it still serves afterwards
        assert.equal(200, assert(H.request(up.port, { path = "/" })).status)
    end)

    it("clears hits on reset and does not record control calls", function()
        assert(H.request(up.port, { path = "/1" }))
        assert(H.request(up.port, { path = "/2" }))
        assert.equal(2, #up:hits())
        up:reset()
        assert.same({}, up:hits())
        local stats = up:stats()
        assert.equal(0, stats.hits)
        assert.equal(0, stats.connections)
        local resp = assert(H.request(up.port, { path = "/3" }))
        assert.equal("1", resp.headers["x-fault-hit"])
    end)

    it("rejects an invalid program", function()
        assert.has_error(function() up:program({ default = { reset = "sideways" } }) end)
    end)
end)

describe("helpers", function()
    it("free_port returns distinct usable ports", function()
        local ports = H.free_ports(3)
        assert.is_number(ports[1])
        assert.are_not.equal(ports[1], ports[2])
        assert.is_number(H.free_port())
    end)

    it("run returns exit code and combined output", function()
        local code, out = H.run("echo out; echo err >&2; exit 3")
        assert.equal(3, code)
        assert.matches("out\n", out)
        assert.matches("err\n", out)
        local code2, out2 = H.run({ "printf", "%s", "a b'c" })
        assert.equal(0, code2)
        assert.equal("a b'c", out2)
    end)

    it("wait_until returns the value or gives up in time", function()
        local n = 0
        assert.equal(3, H.wait_until(function() n = n + 1; return n >= 3 and n end, 2))
        assert.is_nil(H.wait_until(function() return nil end, 0.1))
    end)

    it("stop terminates and reaps the upstream", function()
        local up = H.start_upstream()
        assert.is_true(up:alive())
        local code = up:stop()
        assert.is_number(code)
        assert.is_false(up:alive())
        assert.is_nil(H.connect(up.port))
    end)

    -- start_gateway against a stand-in binary: a shell script that forks a "worker" and execs the upstream on
    -- the configured port, which exercises config rendering, spawning, readiness, signals, logs and cleanup.
    it("start_gateway drives a stand-in gateway", function()
        local dir = H.mkdtemp("fake")
        local fake = dir .. "/fake-gateway"
        H.write_file(fake, table.concat({
            "#!/bin/sh",
            "prefix=$2; conf=$4",
            "port=$(sed -n 's/^listen \\([0-9]*\\);$/\\1/p' \"$conf\")",
            "echo \"starting with prefix $prefix\" >&2",
            "echo \"error log line\" > \"$prefix/logs/error.log\"",
            "sleep 30 &",
            "exec " .. H.shell_quote(os.getenv("LUAJIT") or "luajit") .. " " .. H.shell_quote(H.upstream_script)
                .. " --port \"$port\" --max-seconds 60",
        }, "\n") .. "\n")
        assert.equal(0, (H.run({ "chmod", "+x", fake })))
        local up = H.start_upstream()
        local gw = H.start_gateway({
            bin = fake, upstream = up,
            conf = "listen {{PORT}};\nsecond {{PORT2}};\nupstream {{UPSTREAM}};\nprefix {{PREFIX}};\n",
        })
        local conf = H.read_file(gw.prefix .. "/ricochet.conf")
        assert.matches("listen " .. gw.port .. ";", conf, 1, true)
        assert.matches("upstream 127.0.0.1:" .. up.port .. ";", conf, 1, true)
        assert.is_true(gw:alive())
        assert.equal(200, assert(H.request(gw.port, { path = "/" })).status)
        local workers = gw:workers()
        assert.equal(1, #workers)
        assert.matches("starting with prefix", gw:log(), 1, true)
        assert.matches("error log line", gw:log(), 1, true)
        assert.is_true(gw:signal("STOP"))
        assert.is_true(gw:signal("CONT"))
        assert.is_nil(gw:wait_exit(0.1))
        local code = gw:stop()
        assert.equal(128 + 15, code)
        assert.is_false(gw:alive())
        assert.is_false(H.pid_alive(workers[1]))
        assert.matches("error log line", gw:log(), 1, true)
        up:stop()
        H.run({ "rm", "-rf", dir })

        assert.has_error(function() H.start_gateway({ bin = fake, conf = "listen {{NOPE}};" }) end)
    end)

    it("start_gateway reports a gateway that dies at startup", function()
        local ok, err = pcall(H.start_gateway, { bin = "/bin/false", conf = "x" })
        assert.is_false(ok)
        assert.matches("exited during startup", err, 1, true)
    end)
end)
