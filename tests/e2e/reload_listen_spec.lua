-- a listen address removed by a reload must be closed (README: "a removed one is closed").
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        {{EXTRA}}
        location / { proxy_pass http://up; }
    }
}
]]

describe("a listen address removed by a reload", function()
    it("refuses connections afterwards", function()
        local up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        local gw = H.start_gateway({ conf = CONF, upstream = up, vars = { EXTRA = "" } })
        -- render does not recurse: put PORT2 in by hand
        local ok, err = pcall(function()
            local code, out = gw:reload(CONF, { EXTRA = "listen 127.0.0.1:" .. gw.port2 .. ";" })
            assert.equal(0, code, out)
            local r = H.request(gw.port2, { path = "/two" })
            assert.equal(200, r and r.status, gw:log())
            code, out = gw:reload(CONF, { EXTRA = "" })
            assert.equal(0, code, out)
            assert.truthy(H.wait_until(function() return #gw:workers() == 1 end, 10), gw:log())
            -- the old port: connect must fail; a request must not hang
            local s = socket.tcp()
            s:settimeout(1)
            local c = s:connect("127.0.0.1", gw.port2)
            local answer
            if c then
                s:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = s:receive("*l")
            end
            s:close()
            assert.is_nil(c, ("port %d still accepts connections after its removal (answer: %s)\n%s")
                :format(gw.port2, tostring(answer), io.popen("ss -ltnp 2>/dev/null | grep :" .. gw.port2):read("*a")))
        end)
        gw:stop(); up:stop()
        assert(ok, err)
    end)
end)
