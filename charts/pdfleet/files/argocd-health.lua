-- Argo CD health check for pdfleet.io/DisaggregatedInference.
-- Install under resource.customizations.health.pdfleet.io_DisaggregatedInference
-- in argocd-cm (docs/gitops.md). Argo CD sets `obj` and reads the returned table.
local hs = {}
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the pdfleet operator to report status"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local observed = status.observedGeneration

-- A condition speaks for the current spec when its generation (its own, or the
-- status's) has caught up with metadata.generation.
local function current(condition)
  if generation == nil then
    return true
  end
  local seen = condition.observedGeneration or observed
  return seen ~= nil and seen >= generation
end

local conditions = {}
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    conditions[condition.type] = condition
  end
end

local function describe(condition, fallback)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  if condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason
  end
  return fallback
end

local degraded = conditions["Degraded"]
if degraded ~= nil and degraded.status == "True" and current(degraded) then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end

local ready = conditions["Ready"]
if ready ~= nil and ready.status == "False" and ready.reason == "InvalidSpec" and current(ready) then
  hs.status = "Degraded"
  hs.message = describe(ready, "InvalidSpec")
  return hs
end

if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local progressing = conditions["Progressing"]
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing, "Rolling out")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = describe(ready, "Not ready yet")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
