-- Argo CD health check for the kopf-operators kinds: ImmortalContainer, CopyratorRule, ChaosAgent.
-- They follow the kstatus conventions (docs/observability.md): status.observedGeneration, and exactly
-- one of Ready, Reconciling and Stalled True once the operator has written a status.
-- Degraded: Stalled (a person must act); Progressing: not yet observed, or Reconciling;
-- Suspended: a paused ChaosAgent; Healthy: Ready.
local hs = {status = "Progressing", message = "Waiting for the operator to write a status"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local conditions = {}
for _, condition in ipairs(obj.status.conditions) do
  conditions[condition.type] = condition
end
local function says(condition)
  return (condition.reason or "") .. ": " .. (condition.message or "")
end
local stalled, reconciling, ready = conditions["Stalled"], conditions["Reconciling"], conditions["Ready"]
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = says(stalled)
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = says(reconciling)
  return hs
end
if ready ~= nil and ready.status == "True" then
  local paused = conditions["Paused"]
  if paused ~= nil and paused.status == "True" then
    hs.status = "Suspended"
  else
    hs.status = "Healthy"
  end
  hs.message = says(ready)
  return hs
end
if ready ~= nil then
  hs.message = says(ready)
end
return hs
