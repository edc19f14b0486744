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

-- A CA, a certificate it signs for localhost and 127.0.0.1, and another CA that signs nothing we serve.
local function make_pki()
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
    }
}
]]

describe("TLS to an upstream", function()
    local gw, servers, ports = nil, {}, {}

    setup(function()
        make_pki()
        ports = H.free_ports(5)
        for i, port in ipairs(ports) do
            -- -no_ticket: resumption by the server's session cache, which its page counts
            servers[i] = H.start_process({ "openssl", "s_server", "-accept", "127.0.0.1:" .. port,
                "-cert", dir .. "/leaf.pem", "-key", dir .. "/leaf.key", "-www", "-quiet", "-no_ticket" },
                dir .. "/s_server" .. i .. ".log", { port = port })
        end
        gw = H.start_gateway({ conf = CONF, vars = { DIR = dir, TLSPORT = ports[1], TLSPORT2 = ports[2],
            TLSPORT3 = ports[3], TLSPORT4 = ports[4], TLSPORT5 = ports[5] } })
    end)

    teardown(function()
        if gw then gw:stop() end
        for _, s in ipairs(servers) do s:stop() end
        os.execute("rm -rf " .. H.shell_quote(dir))
    end)

    local function log() return "gateway log:\n" .. (gw and gw:log() or "?") end

    it("verifies the upstream's certificate and speaks TLS 1.3 to it", function()
        local r = assert(H.request(gw.port, { path = "/" }))
        assert.equal(200, r.status, log())
        assert.truthy(r.body:find("Protocol  : TLSv1.3", 1, true), r.body)
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
        local l = gw:log()
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
