-- shared-zone entries are found by name and never freed; every reload that renames a
-- lua_shared_dict (or changes a budget rule) takes new room until reloads are refused.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    lua_shared_dict {{NAME}} 8m;
    upstream up { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://up; }
    }
}
]]

describe("renaming a lua_shared_dict on each reload", function()
    it("keeps working for 12 reloads", function()
        local up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok" } })
        local gw = H.start_gateway({ conf = CONF, upstream = up, vars = { NAME = "d0" } })
        local ok, err = pcall(function()
            for i = 1, 12 do
                local code, out = gw:reload(CONF, { NAME = "d" .. i })
                assert.equal(0, code, ("reload %d: %s"):format(i, out))
            end
        end)
        gw:stop(); up:stop()
        assert(ok, err)
    end)
end)
