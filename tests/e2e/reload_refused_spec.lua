-- a refused reload must leave the running generation untouched, also for workers the master
-- starts after it (a crashed worker's replacement). The new config's lua_shared_dict list and its
-- script_timeout are process globals set while the config is parsed.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local SCRIPT = [[
local route = {}
function route.on_request(req)
    if req.path == "/count" then
        req:respond(200, {}, tostring(ricochet.shared("counts"):incr("hits", 1, 0)))
    elseif req.path == "/spin" then
        -- 100 ms of this process's CPU take at least 100 ms of wall time: 10 times the refused
        -- config's 10ms, a hundredth of the running 10s however busy the machine. Each turn copies
        -- 64 KB, so the loop is a few thousand instructions, far below the instruction bound.
        local t = os.clock() + 0.1
        while os.clock() < t do local _ = ("x"):rep(65536) end
        req:respond(200, {}, "spun")
    end
end
return route
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    lua_shared_dict counts 1m;
    script_timeout 10s;
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://up; }
    }
}
]]

-- parses past lua_shared_dict and script_timeout, then fails (an upstream nobody declared)
local BAD = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    lua_shared_dict other 1m;
    script_timeout 10ms;
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { script {{SCRIPT}}; proxy_pass http://nowhere; }
    }
}
]]

describe("a refused reload", function()
    local up, gw, dir
    before_each(function()
        dir = H.mkdtemp("dict")
        H.write_file(dir .. "/route.lua", SCRIPT)
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { SCRIPT = dir .. "/route.lua" } })
    end)
    after_each(function()
        gw:stop(); up:stop(); H.rm_rf(dir)
    end)

    local function refuse_then_respawn()
        local r = H.request(gw.port, { path = "/count" })
        assert.equal(200, r and r.status, gw:log())
        -- a raw SIGHUP: `-s reload` itself refuses a config it cannot load, before asking the master
        H.write_file(gw.conf_path, gw:render(BAD))
        gw:signal("HUP")
        assert.truthy(H.wait_until(function() return gw:log():find("generation 1 keeps serving") end, 10), gw:log())
        local old = gw:workers()[1]
        os.execute("kill -9 " .. old)
        assert.truthy(H.wait_until(function()
            local w = gw:workers()
            return #w == 1 and w[1] ~= old
        end, 5), gw:log())
        H.sleep(0.3)
    end

    it("leaves ricochet.shared working in a replacement worker", function()
        refuse_then_respawn()
        local r = H.request(gw.port, { path = "/count" })
        assert.equal(200, r and r.status, gw:log())
        assert.equal("2", r.body, gw:log())
    end)

    it("leaves script_timeout as the running config says in a replacement worker", function()
        refuse_then_respawn()
        local r = H.request(gw.port, { path = "/spin", timeout = 30 })
        assert.equal(200, r and r.status, gw:log())
        assert.equal("spun", r.body, gw:log())
    end)
end)
