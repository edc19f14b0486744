-- payments.lua: a payments API that honours Idempotency-Key. Every POST gets a key derived from the order id
-- in its JSON body, so the gateway may retry it (with `idempotency_key on` in the location) and the API
-- charges once. 402 (payment refused) is final at once; 409 (this order was already paid) is a success.
local route = {}

function route.on_request(req)
    if req.method ~= "POST" then return end
    local body = req:json()
    local order = type(body) == "table" and body.order_id
    if type(order) == "string" or type(order) == "number" then
        -- the key names the order, not the attempt: every retry of this payment carries the same one
        req:set_idempotency_key("order-" .. ricochet.sha256(tostring(order)):sub(1, 32))
    elseif not req:idempotency_key() then
        req:respond(400, { ["Content-Type"] = "application/problem+json" },
            '{"title":"a payment needs an order_id","status":400}')
    end
end

function route.classify(res, attempt)
    if res == nil then return nil end
    if res.status == 402 then return "fail" end
    if res.status == 409 then return "accept" end
    return nil
end

return route
