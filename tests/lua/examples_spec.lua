-- The example route scripts (scripts/examples/), each tested offline with the test kit, as a route author would.
package.path = "scripts/?.lua;" .. package.path
local kit = require("ricochet.testing")

describe("payments.lua", function()
    local route = kit.load("scripts/examples/payments.lua")

    it("derives the key from the order id in the body, the same for every attempt", function()
        -- one request at a time, as in the gateway: each kit.request makes req the next request
        local function key_of(body)
            local req = kit.request{ method = "POST", path = "/pay", body = body }
            route.on_request(req)
            assert.equal(req:idempotency_key(), kit.upstream(req)["idempotency-key"])
            return req:idempotency_key()
        end
        local a = key_of('{"order_id":"A-17","amount":5}')
        assert.truthy(a:match("^order%-%x+$"))
        assert.equal(a, key_of('{"amount":5,"order_id":"A-17"}'))
        assert.are_not.equal(a, key_of('{"order_id":"A-18"}'))
    end)

    it("refuses a payment with neither an order id nor a key, and keeps a client's key", function()
        local req = kit.request{ method = "POST", path = "/pay", body = "{}" }
        route.on_request(req)
        assert.equal(400, kit.answer(req).status)
        req = kit.request{ method = "POST", path = "/pay", body = "{}", headers = { ["Idempotency-Key"] = "k1" } }
        route.on_request(req)
        assert.is_nil(kit.answer(req))
        assert.equal("k1", req:idempotency_key())
    end)

    it("makes 402 final and 409 a success, and leaves the rest to the gateway", function()
        assert.equal("fail", route.classify(kit.response{ status = 402 }, kit.attempt{}))
        assert.equal("accept", route.classify(kit.response{ status = 409 }, kit.attempt{}))
        assert.is_nil(route.classify(kit.response{ status = 503 }, kit.attempt{}))
        assert.is_nil(route.classify(nil, kit.attempt{ class = "timeout" }))
    end)
end)

describe("rate_limited.lua", function()
    local route = kit.load("scripts/examples/rate_limited.lua")

    it("waits what Retry-After says", function()
        local verdict, wait = route.classify(kit.response{ status = 429, headers = { ["Retry-After"] = "2" } },
            kit.attempt{})
        assert.equal("retry", verdict)
        assert.equal(2, wait)
    end)

    it("waits until X-RateLimit-Reset", function()
        local reset = tostring(math.floor(os.time() + 3))
        local verdict, wait = route.classify(kit.response{ status = 429, headers = { ["X-RateLimit-Reset"] = reset } },
            kit.attempt{})
        assert.equal("retry", verdict)
        assert.is_true(wait > 0 and wait <= 4, tostring(wait))
    end)

    it("retries a bare 429 with the backoff and has no opinion on anything else", function()
        local verdict, wait = route.classify(kit.response{ status = 429 }, kit.attempt{})
        assert.equal("retry", verdict)
        assert.is_nil(wait)
        assert.is_nil(route.classify(kit.response{ status = 200 }, kit.attempt{}))
    end)
end)

describe("overloaded.lua", function()
    local route = kit.load("scripts/examples/overloaded.lua")

    it("retries a 200 whose body says overloaded", function()
        -- the example's location sets classify_body_max 1k, as its header says
        local function res(body) return kit.response{ status = 200, body = body, classify_body_max = 1024 } end
        assert.equal("retry", route.classify(res('{"error":"overloaded"}'), kit.attempt{}))
        assert.is_nil(route.classify(res('{"items":[]}'), kit.attempt{}))
        assert.is_nil(route.classify(res("not json"), kit.attempt{}))
        -- without it (or above it), the gateway classifies by the head: so does the kit
        assert.is_nil(route.classify(kit.response{ status = 200, body = '{"error":"overloaded"}' }, kit.attempt{}))
        assert.is_nil(route.classify(kit.response{ status = 200 }, kit.attempt{}))
    end)
end)

describe("search.lua", function()
    local route = kit.load("scripts/examples/search.lua")

    it("marks POST /search idempotent and no other POST", function()
        local req = kit.request{ method = "POST", path = "/search", body = "q=shoes" }
        route.on_request(req)
        assert.is_true(req.idempotent)
        req = kit.request{ method = "POST", path = "/orders" }
        route.on_request(req)
        assert.is_nil(req.idempotent)
    end)
end)
