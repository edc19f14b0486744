-- TLS to upstreams end to end: the real binary in front of `openssl s_server -www` (which answers every GET with a
-- page about the TLS session it had, including its session cache hits). A throwaway CA and certificates are made with
-- the openssl command at test time; no key is committed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local dir = H.mkdtemp("tls")

local function openssl(args)
    local argv = { "openssl" }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local code, out = H.run(argv, { timeout = 30 })
    assert(code == 0, "openssl " .. table.concat(args, " ") .. ": " .. tostring(out))
end

-- A CA, a certificate it signs for localhost and 127.0.0.1, and another CA that signs nothing we serve; for the
-- gateway's own listeners, a.test (ECDSA) and b.test (RSA) from the same CA. Made once per run of this file.
local pki_made = false
local function make_pki()
    if pki_made then return end
    pki_made = true
    os.execute("mkdir -p " .. H.shell_quote(dir))
    local ec = { "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes" }
    local function req(extra)
        local a = { "req" }
        for _, x in ipairs(ec) do a[#a + 1] = x end
        for _, x in ipairs(extra) do a[#a + 1] = x end
        openssl(a)
    end
    req({ "-x509", "-keyout", dir .. "/ca.key", "-out", dir .. "/ca.pem", "-days", "1", "-subj", "/CN=ricochet test CA" })
    req({ "-x509", "-keyout", dir .. "/other.key", "-out", dir .. "/other.pem", "-days", "1", "-subj", "/CN=another CA" })
    req({ "-keyout", dir .. "/leaf.key", "-out", dir .. "/leaf.csr", "-subj", "/CN=localhost" })
    H.write_file(dir .. "/ext.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl({ "x509", "-req", "-in", dir .. "/leaf.csr", "-CA", dir .. "/ca.pem", "-CAkey", dir .. "/ca.key",
        "-CAcreateserial", "-out", dir .. "/leaf.pem", "-days", "1", "-extfile", dir .. "/ext.cnf" })
    for name, key in pairs({ ["a.test"] = ec, ["b.test"] = { "-newkey", "rsa:2048", "-nodes" } }) do
        local a = { "req" }
        for _, x in ipairs(key) do a[#a + 1] = x end
        for _, x in ipairs({ "-keyout", dir .. "/" .. name .. ".key", "-out", dir .. "/" .. name .. ".csr",
            "-subj", "/CN=" .. name }) do a[#a + 1] = x end
        openssl(a)
        H.write_file(dir .. "/" .. name .. ".cnf", "subjectAltName=DNS:" .. name .. "\n")
        openssl({ "x509", "-req", "-in", dir .. "/" .. name .. ".csr", "-CA", dir .. "/ca.pem", "-CAkey",
            dir .. "/ca.key", "-CAcreateserial", "-out", dir .. "/" .. name .. ".pem", "-days", "1",
            "-extfile", dir .. "/" .. name .. ".cnf" })
    end
end

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    retry_attempts 2;
    retry_backoff 1ms 2ms;
    server {
        listen 127.0.0.1:{{PORT}};
        location / {
            proxy_ssl_trusted_certificate {{DIR}}/ca.pem;
            proxy_ssl_name localhost;
            proxy_pass https://127.0.0.1:{{TLSPORT}};
        }
        location /by-ip/ {
            proxy_ssl_trusted_certificate {{DIR}}/ca.pem;
            proxy_pass https://127.0.0.1:{{TLSPORT2}};
        }
        location /stranger/ {
            proxy_ssl_trusted_certificate {{DIR}}/other.pem;
            proxy_pass https://localhost:{{TLSPORT3}};
        }
        location /misnamed/ {
            proxy_ssl_trusted_certificate {{DIR}}/ca.pem;
            proxy_ssl_name api.example.com;
            proxy_pass https://127.0.0.1:{{TLSPORT4}};
        }
        location /unverified/ {
            proxy_ssl_verify off;
            proxy_pass https://localhost:{{TLSPORT5}};
        }
        location /files/ {
            proxy_ssl_trusted_certificate {{DIR}}/ca.pem;
            proxy_pass https://localhost:{{TLSPORT6}};
        }
    }
}
]]

describe("TLS to an upstream", function()
    local gw, servers, ports = nil, {}, {}

    setup(function()
        make_pki()
        ports = H.free_ports(6)
        for i = 1, 5 do
            local port = ports[i]
            -- -no_ticket: resumption by the server's session cache, which its page counts
            servers[i] = H.start_process({ "openssl", "s_server", "-accept", "127.0.0.1:" .. port,
                "-cert", dir .. "/leaf.pem", "-key", dir .. "/leaf.key", "-www", "-quiet", "-no_ticket" },
                dir .. "/s_server" .. i .. ".log", { port = port })
        end
        -- -WWW: files from its directory, under /files/ there
        os.execute("mkdir -p " .. H.shell_quote(dir .. "/files"))
        H.write_file(dir .. "/files/big.bin", H.body_of_size(5 * 1024 * 1024 + 3))
        servers[6] = H.start_process({ "sh", "-c", "cd " .. H.shell_quote(dir) .. " && exec openssl s_server -accept "
            .. "127.0.0.1:" .. ports[6] .. " -cert leaf.pem -key leaf.key -WWW -quiet" },
            dir .. "/s_server6.log", { port = ports[6] })
        gw = H.start_gateway({ conf = CONF, vars = { DIR = dir, TLSPORT = ports[1], TLSPORT2 = ports[2],
            TLSPORT3 = ports[3], TLSPORT4 = ports[4], TLSPORT5 = ports[5], TLSPORT6 = ports[6] } })
    end)

    teardown(function()
        if gw then gw:stop() end
        for _, s in ipairs(servers) do s:stop() end
        os.execute("rm -rf " .. H.shell_quote(dir))
        pki_made = false
    end)

    local function log() return "gateway log:\n" .. (gw and gw:log() or "?") end

    it("verifies the upstream's certificate and speaks TLS 1.3 to it", function()
        local r = assert(H.request(gw.port, { path = "/" }))
        assert.equal(200, r.status, log())
        assert.truthy(r.body:find("Protocol  : TLSv1.3", 1, true), r.body)
    end)

    it("relays a large answer whole (its TLS records outgrow the read buffer)", function()
        local r = assert(H.request(gw.port, { path = "/files/big.bin", timeout = 20 }))
        assert.equal(200, r.status, log())
        assert.equal(5 * 1024 * 1024 + 3, #r.body)
        assert.truthy(r.body == H.read_file(dir .. "/files/big.bin"), "the body arrived as the upstream sent it")
    end)

    it("verifies an IP address against the certificate's IP entries", function()
        local r = assert(H.request(gw.port, { path = "/by-ip/" }))
        assert.equal(200, r.status, log())
    end)

    it("resumes its session: the upstream sees fewer full handshakes than requests", function()
        for _ = 1, 4 do assert.equal(200, assert(H.request(gw.port, { path = "/" })).status) end
        local r = assert(H.request(gw.port, { path = "/" }))
        local accepts = tonumber(r.body:match("(%d+) server accepts"))
        local hits = tonumber(r.body:match("(%d+) session cache hits"))
        assert.truthy(accepts and hits, r.body)
        assert.is_true(hits >= 1 and accepts - hits < accepts, r.body)
    end)

    it("refuses a certificate from another CA: 502, a connect_error, and says why", function()
        local r = assert(H.request(gw.port, { path = "/stranger/" }))
        assert.equal(502, r.status)
        -- the access log line is written as the request ends, a moment after the answer went out
        local l = H.wait_until(function()
            local t = gw:log()
            return t:find('"path":"/stranger/"[^\n]*"class":"connect_error"') and t
        end) or gw:log()
        assert.truthy(l:find("TLS handshake failed: the certificate did not verify: unable to get local issuer certificate", 1, true), l)
        assert.truthy(l:find('"path":"/stranger/"[^\n]*"class":"connect_error"'), l)
    end)

    it("refuses a certificate for another name", function()
        local r = assert(H.request(gw.port, { path = "/misnamed/" }))
        assert.equal(502, r.status)
        assert.truthy(gw:log():find("hostname mismatch", 1, true), log())
    end)

    it("takes any certificate with proxy_ssl_verify off", function()
        local r = assert(H.request(gw.port, { path = "/unverified/" }))
        assert.equal(200, r.status, log())
    end)
end)

describe("TLS upstreams in the config", function()
    it("refuses a CA file that cannot be loaded, and an upstream reached both ways, with FILE:LINE", function()
        local conf = [[
http {
    upstream api { server 127.0.0.1:1; }
    server {
        listen 127.0.0.1:{{PORT}};
        location /a { proxy_ssl_trusted_certificate /nonexistent/ca.pem; proxy_pass https://api; }
    }
}
]]
        local gw = H.start_gateway({ conf = conf, args = { "-t" }, wait = false })
        assert.is_not.equal(0, gw:wait_exit(10))
        gw:stop()
        assert.truthy(gw:log():find('ricochet%.conf:5: upstream "api": cannot load /nonexistent/ca.pem'), gw:log())
        local both = conf:gsub("location /a { proxy_ssl_trusted_certificate /nonexistent/ca.pem; proxy_pass https://api; }",
            "location /a { proxy_pass https://api; }\n        location /b { proxy_pass http://api; }")
        local gw2 = H.start_gateway({ conf = both, args = { "-t" }, wait = false })
        assert.is_not.equal(0, gw2:wait_exit(10))
        gw2:stop()
        assert.truthy(gw2:log():find('ricochet%.conf:6: upstream "api" is reached with http:// here and with https:// in'), gw2:log())
    end)
end)

-- The gateway terminating TLS: clients are the real curl and `openssl s_client`.
local TERMINATE = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    ssl_certificate {{DIR}}/a.test.pem;
    ssl_certificate_key {{DIR}}/a.test.key;
    # every handshake of these specs must finish within it, on a busy machine too (a few ms each)
    ssl_handshake_timeout 3s;
    client_max_body_size 8m;
    retry_backoff 1ms 2ms;
    server {
        listen 127.0.0.1:{{PORT}} ssl;
        server_name a.test;
        location / { proxy_pass http://{{UPSTREAM}}; }
    }
    server {
        listen 127.0.0.1:{{PORT}} ssl;
        server_name .b.test;
        ssl_certificate {{DIR}}/b.test.pem;
        ssl_certificate_key {{DIR}}/b.test.key;
        location / { proxy_pass http://{{UPSTREAM}}; }
    }
    server {
        listen 127.0.0.1:{{PORT2}} ssl;
        server_name a.test;
        ssl_protocols TLSv1.3;
        location / { proxy_pass http://{{UPSTREAM}}; }
    }
}
]]

-- openssl s_client against the gateway: its report of the handshake. stdin (a file) is sent once connected.
local function s_client(port, args, stdin)
    local cmd = { "openssl", "s_client", "-connect", "127.0.0.1:" .. port, "-CAfile", dir .. "/ca.pem" }
    for _, a in ipairs(args or {}) do cmd[#cmd + 1] = a end
    for i, a in ipairs(cmd) do cmd[i] = H.shell_quote(a) end
    local line = table.concat(cmd, " ") .. " < " .. H.shell_quote(stdin or "/dev/null")
    local _, out = H.run(line, { timeout = 20 })
    return out
end

-- curl over https to name:port (resolved to the loopback), verifying against the test CA.
local function curl(port, name, path, args)
    local cmd = { "curl", "-sS", "--max-time", "20", "--cacert", dir .. "/ca.pem", "--resolve",
        name .. ":" .. port .. ":127.0.0.1" }
    for _, a in ipairs(args or {}) do cmd[#cmd + 1] = a end
    cmd[#cmd + 1] = "https://" .. name .. ":" .. port .. path
    return H.run(cmd, { timeout = 30 })
end

describe("TLS for clients (listen ... ssl)", function()
    local up, gw, port2

    setup(function()
        make_pki()
        up = H.start_upstream()
        port2 = H.free_ports(1)[1]
        gw = H.start_gateway({ conf = TERMINATE, upstream = up, vars = { DIR = dir, PORT2 = port2 } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        os.execute("rm -rf " .. H.shell_quote(dir))
        pki_made = false
    end)

    local function log() return "gateway log:\n" .. (gw and gw:log() or "?") end

    it("gives two names on one port their own certificates, and unknown names the default server's", function()
        local a = s_client(gw.port, { "-servername", "a.test", "-verify_return_error", "-brief" })
        assert.truthy(a:find("CN = a.test", 1, true), a)
        assert.truthy(a:find("Verification: OK", 1, true), a)
        local b = s_client(gw.port, { "-servername", "b.test", "-verify_return_error", "-brief" })
        assert.truthy(b:find("CN = b.test", 1, true), b)
        assert.truthy(b:find("Verification: OK", 1, true), b)
        local w = s_client(gw.port, { "-servername", "x.b.test", "-brief" })
        assert.truthy(w:find("CN = b.test", 1, true), w)
        local unknown = s_client(gw.port, { "-servername", "nobody.test", "-brief" })
        assert.truthy(unknown:find("CN = a.test", 1, true), unknown)
        local none = s_client(gw.port, { "-noservername", "-brief" })
        assert.truthy(none:find("CN = a.test", 1, true), none)
    end)

    it("negotiates TLS 1.3 and ALPN http/1.1, and serves a request over it to the upstream", function()
        local hs = s_client(gw.port, { "-servername", "b.test", "-alpn", "h2,http/1.1" })
        assert.truthy(hs:find("New, TLSv1.3", 1, true), hs)
        assert.truthy(hs:find("ALPN protocol: http/1.1", 1, true), hs)
        up:program({ default = { status = 200, body = "over tls\n" } })
        local code, out = curl(gw.port, "b.test", "/hello", { "-w", "\n%{http_code} %{http_version}" })
        assert.equal(0, code, out)
        assert.truthy(out:find("over tls\n\n200 1.1", 1, true), out .. log())
        local hits = up:hits()
        local last = hits[#hits]
        assert.equal("/hello", last.path)
        assert.equal("https", last.header_map["x-forwarded-proto"])
    end)

    it("still speaks TLS 1.2 with a forward-secret AEAD cipher", function()
        local hs = s_client(gw.port, { "-servername", "a.test", "-tls1_2", "-brief" })
        assert.truthy(hs:find("Protocol version: TLSv1.2", 1, true), hs)
        assert.truthy(hs:find("Ciphersuite: ECDHE%-ECDSA%-AES%d+%-GCM") or hs:find("Ciphersuite: ECDHE%-ECDSA%-CHACHA20"), hs)
    end)

    it("refuses what ssl_protocols leaves out, and a client that offers only h2", function()
        local old = s_client(port2, { "-servername", "a.test", "-tls1_2", "-brief" })
        assert.falsy(old:find("Protocol version", 1, true), old)
        local new = s_client(port2, { "-servername", "a.test", "-tls1_3", "-brief" })
        assert.truthy(new:find("Protocol version: TLSv1.3", 1, true), new)
        local h2 = s_client(gw.port, { "-servername", "a.test", "-alpn", "h2", "-brief" })
        assert.truthy(h2:find("no application protocol", 1, true), h2)
        assert.truthy(H.wait_until(function()
            return gw:log():find("TLS handshake failed: [^\n]*no application protocol, client: 127%.0%.0%.1")
        end), log())
    end)

    it("resumes sessions: a second connection with the first one's ticket is an abbreviated handshake", function()
        local req = dir .. "/req.txt"
        H.write_file(req, "GET /resume HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        local sess = dir .. "/a.sess"
        local first = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-sess_out", sess }, req)
        assert.truthy(first:find("New, TLSv1.3", 1, true), first)
        assert.truthy(first:find("HTTP/1.1 200", 1, true), first)
        -- two workers: the ticket keys are shared, so whichever accepts it resumes it
        for _ = 1, 3 do
            local again = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-sess_in", sess }, req)
            assert.truthy(again:find("Reused, TLSv1.3", 1, true), again)
            assert.truthy(again:find("HTTP/1.1 200", 1, true), again)
        end
    end)

    it("carries large bodies both ways intact, and keeps the connection alive between requests", function()
        local body = H.body_of_size(3 * 1024 * 1024 + 17)
        local file = dir .. "/upload.bin"
        H.write_file(file, body)
        up:reset()
        up:program({ default = { status = 200, body_size = 2 * 1024 * 1024 + 5 } })
        local code, out = curl(gw.port, "a.test", "/upload", { "--data-binary", "@" .. file, "-o", dir .. "/down.bin",
            "-w", "%{http_code} %{size_download}" })
        assert.equal(0, code, out)
        assert.equal("200 " .. (2 * 1024 * 1024 + 5), out, log())
        local hits = up:hits()
        assert.equal(#body, hits[1].body_len)
        assert.truthy(hits[1].body == body, "the upstream got the body the client sent")
        -- two requests, one TLS connection: curl says it reused it, and the upstream saw both
        code, out = curl(gw.port, "a.test", "/one", { "-v", "-o", "/dev/null", "https://a.test:" .. gw.port .. "/two" })
        assert.equal(0, code, out)
        assert.truthy(out:find("Re%-using existing connection") or out:find("Reusing existing"), out)
        assert.equal(3, up:stats().hits)
    end)

    it("reads a request that came in one record larger than its first read (head, body and a pipelined one)", function()
        -- s_client sends each read of its stdin (8 KiB) as one record: the gateway's first read (4 KiB) takes
        -- part of it, and the rest waits inside TLS, where no readable event announces it
        local body = H.text_body(5000)
        local req = "POST /in-one-record HTTP/1.1\r\nHost: a.test\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
            .. "GET /pipelined HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
        local file = dir .. "/one-record.txt"
        H.write_file(file, req)
        up:reset()
        up:program({ default = { status = 200, body = "got it\n" } })
        local out = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-quiet" }, file)
        local _, answers = out:gsub("HTTP/1.1 200", "")
        assert.equal(2, answers, out .. log())
        local hits = up:hits()
        assert.equal(2, #hits)
        assert.equal(#body, hits[1].body_len)
        assert.equal("/pipelined", hits[2].path)
    end)

    -- A client's connection reads ahead once its handshake is done (one read takes what the socket has):
    -- records read ahead wait inside TLS, where no readable event announces them; a record that came in
    -- part is announced by the socket when its rest comes, and must not wake the worker meanwhile.
    local READ_AHEAD_CLIENT = [[
import socket, ssl, sys, time
port, ca, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
sock = socket.create_connection(("127.0.0.1", port))
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(inc, out, server_hostname="a.test")
def flush():
    data = out.read()
    if data:
        sock.sendall(data)
def pump():
    data = sock.recv(65536)
    if not data:
        raise EOFError
    inc.write(data)
while True:
    try:
        tls.do_handshake()
        break
    except ssl.SSLWantReadError:
        flush()
        pump()
flush()
one = b"GET /first HTTP/1.1\r\nHost: a.test\r\n\r\n"
two = b"GET /second HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
tls.write(one)
tls.write(two)  # two records, sent in one piece
wire = out.read()
if mode == "whole":
    sock.sendall(wire)
else:
    cut = len(wire) - 20  # the second record in part: its last 20 bytes come later
    sock.sendall(wire[:cut])
    time.sleep(float(mode))
    sys.stdout.write("waited\n")
    sys.stdout.flush()
    sock.sendall(wire[cut:])
got = b""
sock.settimeout(10)
while got.count(b"HTTP/1.1 200") < 2:
    try:
        got += tls.read(65536)
        continue
    except ssl.SSLWantReadError:
        pass
    except ssl.SSLZeroReturnError:
        break
    try:
        pump()
    except (EOFError, socket.timeout):
        break
sys.stdout.write(got.decode("latin-1"))
]]

    local function read_ahead_client(mode)
        local script = dir .. "/read_ahead.py"
        H.write_file(script, READ_AHEAD_CLIENT)
        return H.run({ "/usr/bin/python3", script, tostring(gw.port), dir .. "/ca.pem", mode }, { timeout = 20 })
    end

    local function workers_cpu_s()
        local ticks = 0
        for _, pid in ipairs(gw:workers()) do
            local stat = H.read_file("/proc/" .. pid .. "/stat") or ""
            local after = stat:match("^.*%)%s+(.*)$") or ""
            local f = {}
            for w in after:gmatch("%S+") do f[#f + 1] = w end
            ticks = ticks + (tonumber(f[12]) or 0) + (tonumber(f[13]) or 0) -- utime, stime
        end
        return ticks / 100
    end

    it("answers two requests that came as two records in one piece (the second read ahead, inside TLS)", function()
        up:reset()
        up:program({ default = { status = 200, body = "ok\n" } })
        local rc, out = read_ahead_client("whole")
        assert.equal(0, rc, out)
        local _, answers = out:gsub("HTTP/1.1 200", "")
        assert.equal(2, answers, out .. log())
        local hits = up:hits()
        assert.equal(2, #hits, log())
        assert.equal("/first", hits[1].path)
        assert.equal("/second", hits[2].path)
    end)

    it("waits for the rest of a record that came in part without spinning, then answers it", function()
        up:reset()
        up:program({ default = { status = 200, body = "ok\n" } })
        local before = workers_cpu_s()
        local rc, out = read_ahead_client("1.5")
        local spent = workers_cpu_s() - before
        assert.equal(0, rc, out)
        assert.truthy(out:find("waited", 1, true), out)
        local _, answers = out:gsub("HTTP/1.1 200", "")
        assert.equal(2, answers, out .. log())
        -- a worker woken in a loop by the part it holds burns the whole 1.5 s; a waiting one next to nothing
        assert.is_true(spent < 0.75, "the workers spent " .. spent .. " s of CPU while the record waited")
    end)

    it("ends a connection with close_notify, so a body that ends with it is not taken for a cut one", function()
        up:program({ default = { raw = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end\n", close = true } })
        local req = dir .. "/req10.txt"
        H.write_file(req, "GET /to-the-end HTTP/1.0\r\nHost: a.test\r\n\r\n")
        local out = s_client(gw.port, { "-servername", "a.test", "-ign_eof" }, req)
        -- s_client prints "closed" when the peer's close_notify ends the stream, nothing after a bare close
        local at = out:find("until the end\n", 1, true)
        assert.truthy(at, out)
        assert.truthy(out:find("\nclosed\n", at, true), out)
        local code, body = curl(gw.port, "a.test", "/to-the-end", { "--http1.0" })
        assert.equal(0, code, body .. log())
        assert.equal("until the end\n", body)
    end)

    it("closes a handshake that does not finish in ssl_handshake_timeout, while serving others", function()
        local data, closed = H.raw(gw.port, "", { timeout = 20 })
        assert.is_true(closed, "closed: " .. tostring(data))
        assert.equal("", data)
        -- a record that never arrives whole: the worker must wait for it, not spin, and its clock must run
        local partial = assert(H.connect(gw.port))
        assert(partial:send("\22\3\1\2\0\1\0\1"))
        for _ = 1, 4 do
            local code, out = curl(gw.port, "a.test", "/meanwhile", { "-o", "/dev/null", "-w", "%{http_code}" })
            assert.equal(0, code, out)
            assert.equal("200", out)
        end
        local rest, why = partial:read_response({ timeout = 20 })
        partial:close()
        assert.falsy(rest, "an answer to half a record?")
        assert.truthy(why, "the connection was closed")
        assert.truthy(H.wait_until(function()
            local _, n = gw:log():gsub("client timed out during the TLS handshake, client: 127%.0%.0%.1", "")
            return n >= 2
        end, 20), log())
    end)

    it("answers plain HTTP sent to the TLS address with a 400, as nginx does", function()
        local data, closed = H.raw(gw.port, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", { timeout = 8 })
        assert.is_true(closed)
        assert.truthy(data:find("^HTTP/1.1 400 Bad Request\r\n"), data)
        assert.truthy(H.wait_until(function()
            return gw:log():find("client sent plain HTTP to a TLS address %(400%), client: 127%.0%.0%.1")
        end), log())
    end)

    it("resumes a session only on the server that issued it", function()
        local req = dir .. "/req-b.txt"
        H.write_file(req, "GET /scoped HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
        for _, version in ipairs({ "-tls1_3", "-tls1_2" }) do
            local sess = dir .. "/b" .. version .. ".sess"
            local first = s_client(gw.port, { version, "-servername", "b.test", "-ign_eof", "-sess_out", sess }, req)
            assert.truthy(first:find("New, TLSv1.", 1, true), first)
            local other = s_client(gw.port, { version, "-servername", "a.test", "-ign_eof", "-sess_in", sess }, req)
            assert.truthy(other:find("New, TLSv1.", 1, true), version .. ": b.test's session resumed on a.test\n" .. other)
            assert.truthy(other:find("subject=CN = a.test", 1, true), other)
            local same = s_client(gw.port, { version, "-servername", "b.test", "-ign_eof", "-sess_in", sess }, req)
            assert.truthy(same:find("Reused, TLSv1.", 1, true), version .. ": " .. same)
        end
    end)
end)

describe("TLS for clients in the config", function()
    setup(make_pki)
    teardown(function()
        os.execute("rm -rf " .. H.shell_quote(dir))
        pki_made = false
    end)

    local function refused(conf, pattern)
        local gw = H.start_gateway({ conf = conf, vars = { DIR = dir }, args = { "-t" }, wait = false })
        local code = gw:wait_exit(10)
        gw:stop()
        assert.is_not.equal(0, code, gw:log())
        assert.truthy(gw:log():find(pattern), gw:log())
    end

    local function server(body)
        return "http {\n    server {\n        listen 127.0.0.1:{{PORT}} ssl;\n" .. body
            .. "        location / { proxy_pass http://127.0.0.1:1; }\n    }\n}\n"
    end

    it("refuses a missing key file, a key of another certificate and a missing certificate with FILE:LINE", function()
        refused(server("        ssl_certificate {{DIR}}/a.test.pem;\n        ssl_certificate_key {{DIR}}/missing.key;\n"),
            'ricochet%.conf:5: cannot read ssl_certificate_key "[^"]*/missing%.key": No such file or directory')
        refused(server("        ssl_certificate {{DIR}}/a.test.pem;\n        ssl_certificate_key {{DIR}}/b.test.key;\n"),
            'ricochet%.conf:5: ssl_certificate_key "[^"]*/b%.test%.key" is not the key of ssl_certificate "[^"]*/a%.test%.pem" %(.-ricochet%.conf:4%)')
        refused(server("        ssl_certificate {{DIR}}/a.test.key;\n        ssl_certificate_key {{DIR}}/a.test.key;\n"),
            'ricochet%.conf:4: ssl_certificate "[^"]*/a%.test%.key" is not a PEM certificate chain')
        -- a chain with the CA first, and an encrypted key: each error says what to do
        H.write_file(dir .. "/wrong-order.pem", H.read_file(dir .. "/ca.pem") .. H.read_file(dir .. "/a.test.pem"))
        refused(server("        ssl_certificate {{DIR}}/wrong-order.pem;\n        ssl_certificate_key {{DIR}}/a.test.key;\n"),
            'ricochet%.conf:4: ssl_certificate "[^"]*/wrong%-order%.pem" must start with the certificate of ssl_certificate_key %(the leaf%)')
        openssl({ "pkey", "-in", dir .. "/a.test.key", "-aes256", "-passout", "pass:secret", "-out", dir .. "/enc.key" })
        refused(server("        ssl_certificate {{DIR}}/a.test.pem;\n        ssl_certificate_key {{DIR}}/enc.key;\n"),
            'ricochet%.conf:5: ssl_certificate_key "[^"]*/enc%.key" is encrypted')
        refused(server(""), "ricochet%.conf:3: listen 127%.0%.0%.1:%d+ ssl: the server has no ssl_certificate")
    end)

    it("refuses old protocols, nginx's shared cache and an address both plain and ssl", function()
        local pair = "        ssl_certificate {{DIR}}/a.test.pem;\n        ssl_certificate_key {{DIR}}/a.test.key;\n"
        refused(server(pair .. "        ssl_protocols TLSv1.1 TLSv1.2;\n"),
            'ricochet%.conf:6: TLSv1%.1 is not supported in "ssl_protocols"')
        refused(server(pair .. "        ssl_session_cache shared:SSL:10m;\n"),
            'ricochet%.conf:6: "shared:SSL:10m" is not supported in "ssl_session_cache"')
        refused("http {\n    server { listen 127.0.0.1:{{PORT}} ssl;\n" .. pair .. " location / { } }\n"
            .. "    server { listen 127.0.0.1:{{PORT}}; server_name other; location / { } }\n}\n",
            "ricochet%.conf:6: listen 127%.0%.0%.1:%d+ is plain here and ssl in [^\n]*ricochet%.conf:2")
        refused(server(pair):gsub(" ssl;", " ssl http2;"), 'ricochet%.conf:3: "http2" in "listen" is not supported')
        refused(server(pair .. "        ssl on;\n"), 'ricochet%.conf:6: unknown directive "ssl": TLS is a parameter of listen')
    end)

    it("refuses one name for two servers on an address (which one SNI picks must not depend on the order)", function()
        local pair = "        ssl_certificate {{DIR}}/a.test.pem;\n        ssl_certificate_key {{DIR}}/a.test.key;\n"
        refused("http {\n    server { listen 127.0.0.1:{{PORT}} ssl; server_name a.test;\n" .. pair .. " location / { } }\n"
            .. "    server { listen 127.0.0.1:{{PORT}} ssl; server_name b.test A.test;\n" .. pair .. " location / { } }\n}\n",
            'ricochet%.conf:6: server name "a%.test" on 127%.0%.0%.1:%d+ is also the name of the server at [^\n]*ricochet%.conf:2')
    end)

    it("passes ricochet -t with good certificates", function()
        local gw = H.start_gateway({ conf = server("        ssl_certificate {{DIR}}/b.test.pem;\n        ssl_certificate_key {{DIR}}/b.test.key;\n"),
            vars = { DIR = dir }, args = { "-t" }, wait = false })
        local code = gw:wait_exit(10)
        gw:stop()
        assert.equal(0, code, gw:log())
    end)
end)

-- A reload makes every TLS context again: a server whose certificate is the same keeps its session
-- ticket keys (the tickets its clients hold resume), one whose certificate changed gets the new one.
local RELOADED = [[
worker_processes 2;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
{{SHIFT}}    server {
        listen 127.0.0.1:{{PORT}} ssl;
        server_name a.test;
        ssl_certificate {{DIR}}/{{CERT}}.pem;
        ssl_certificate_key {{DIR}}/{{CERT}}.key;
        location / { proxy_pass http://{{UPSTREAM}}; }
    }
}
]]

describe("TLS across a reload", function()
    local up, gw

    setup(function()
        make_pki()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = RELOADED, upstream = up, vars = { DIR = dir, CERT = "a.test", SHIFT = "" } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("resumes a session issued before the reload, and serves a changed certificate after one", function()
        up:program({ default = { status = 200, body = "ok" } })
        local req = dir .. "/reload-req.txt"
        H.write_file(req, "GET /r HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        local sess = dir .. "/reload.sess"
        local first = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-sess_out", sess }, req)
        assert.truthy(first:find("New, TLSv1.3", 1, true), first)
        -- the same certificate, the server block a few lines further down
        local code, out = gw:reload(RELOADED, { CERT = "a.test", SHIFT = "\n\n\n" })
        assert.equal(0, code, out .. gw:log())
        for _ = 1, 3 do -- whichever new worker accepts it
            local again = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-sess_in", sess }, req)
            assert.truthy(again:find("Reused, TLSv1.3", 1, true), again)
            assert.truthy(again:find("HTTP/1.1 200", 1, true), again)
        end
        -- another certificate for the name: the next handshake shows it, and the old session is not resumed
        code, out = gw:reload(RELOADED, { CERT = "b.test", SHIFT = "" })
        assert.equal(0, code, out .. gw:log())
        local changed = s_client(gw.port, { "-servername", "a.test", "-ign_eof", "-sess_in", sess }, req)
        assert.truthy(changed:find("CN = b.test", 1, true), changed)
        assert.truthy(changed:find("New, TLSv1.3", 1, true), changed)
    end)
end)
