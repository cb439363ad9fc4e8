#!/usr/bin/env bash
# docs/gateway.md's walkthrough as one script: the operator, the GAIE InferencePool CRD, Envoy Gateway with Envoy AI
# Gateway, the quickstart's CPU fleet behind an InferencePool, the HTTPRoute, the Endpoint Picker's caller token
# on the gateway's side (EnvoyPatchPolicy), a first answer through the Gateway, then cleanup. Needs kubectl, helm
# and curl pointed at a cluster (Services of type LoadBalancer, or the port-forward fallback below), and docker when
# BUILD_IMAGES=1. Run from anywhere; tests/k8s/test_quickstart_gateway_k8s.py runs it.
#
#   REGISTRY=registry.example.com/me docs/quickstart-gateway.sh
#
# REGISTRY      where the images are (or go, with BUILD_IMAGES=1); the cluster must be able to pull from it
# BUILD_IMAGES  1: `make images push-images` first (docker; takes a while: the runtime images hold vLLM)
# LOCAL_PORT    the port-forward's local port when the Gateway has no address (default 8080)
# READY_TIMEOUT how long to wait for the fleet (default 30m: the engines download the model, ~1 GB)
# KEEP          1: leave everything in place (skip the cleanup)
set -euo pipefail

REGISTRY=${REGISTRY:?set REGISTRY to where the images are (e.g. registry.example.com/me)}
BUILD_IMAGES=${BUILD_IMAGES:-0}
LOCAL_PORT=${LOCAL_PORT:-8080}
READY_TIMEOUT=${READY_TIMEOUT:-30m}
KEEP=${KEEP:-0}
NAMESPACE=pdfleet-demo                     # examples/quickstart-gateway.yaml's metadata.namespace
FLEET=quickstart-gw                        # its metadata.name: the InferencePool's name too
MODEL=Qwen/Qwen2.5-0.5B-Instruct           # its spec.model.name: the name requests use
GATEWAY=inference-gateway                  # examples/quickstart-gateway/envoy-gateway.yaml's Gateway
CALLER_SECRET=$FLEET-epp-caller            # the picker's caller token (key token), made by the operator
GAIE_CRD=https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/v1.6.0/v1-manifests.yaml
EG_VERSION=v1.8.1                          # Envoy Gateway, as Envoy AI Gateway v1.1.0 is built on
AIGW_VERSION=v1.1.0                        # Envoy AI Gateway
AIGW_RAW=https://raw.githubusercontent.com/envoyproxy/ai-gateway/$AIGW_VERSION
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

cleanup() {
  [ -n "${PORT_FORWARD:-}" ] && kill "$PORT_FORWARD" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then return; fi
  step "cleanup"
  kubectl delete -f examples/quickstart-gateway/envoy-patch-policy.yaml --ignore-not-found --timeout=2m || true
  kubectl delete -f examples/quickstart-gateway/envoy-gateway.yaml --ignore-not-found --wait=true --timeout=5m || true
  kubectl delete -f examples/quickstart-gateway.yaml --ignore-not-found --wait=true --timeout=5m || true
  helm uninstall aieg aieg-crd -n envoy-ai-gateway-system --wait || true
  helm uninstall eg -n envoy-gateway-system --wait || true
  kubectl delete namespace "$NAMESPACE" envoy-ai-gateway-system envoy-gateway-system --ignore-not-found \
    --wait=true --timeout=5m || true
  helm uninstall pdfleet -n pdfleet-system --wait || true
  kubectl delete namespace pdfleet-system --ignore-not-found --wait=true --timeout=5m || true
  # Helm never deletes CRDs, and neither do we (deleting one deletes every object of its kind):
  #   kubectl delete -f crds/ ; kubectl delete -f $GAIE_CRD
}
trap cleanup EXIT

if [ "$BUILD_IMAGES" = 1 ]; then
  step "images: build and push operator, runtime and runtime-cpu to $REGISTRY"
  make images push-images REGISTRY="$REGISTRY"
fi

step "docs/quickstart.md steps 2-3: the operator, and the fleet's namespace"
helm upgrade --install pdfleet charts/pdfleet -n pdfleet-system --create-namespace \
  --set image.repository="$REGISTRY/pdfleet-operator" \
  --set runtimeImage.repository="$REGISTRY/pdfleet-runtime-cpu" \
  --wait --timeout 5m
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -

step "1. the InferencePool CRD (GAIE v1.6.0), and the operator restarted to watch it"
kubectl apply -f "$GAIE_CRD"
kubectl -n pdfleet-system rollout restart deployment/pdfleet
kubectl -n pdfleet-system rollout status deployment/pdfleet --timeout=5m

step "2. Envoy Gateway $EG_VERSION with Envoy AI Gateway $AIGW_VERSION's InferencePool support"
helm upgrade -i eg oci://docker.io/envoyproxy/gateway-helm --version "$EG_VERSION" \
  -n envoy-gateway-system --create-namespace \
  -f "$AIGW_RAW/manifests/envoy-gateway-values.yaml" \
  -f "$AIGW_RAW/examples/inference-pool/envoy-gateway-values-addon.yaml"
kubectl -n envoy-gateway-system wait --for=condition=Available deployment/envoy-gateway --timeout=5m
helm upgrade -i aieg-crd oci://docker.io/envoyproxy/ai-gateway-crds-helm --version "$AIGW_VERSION" \
  -n envoy-ai-gateway-system --create-namespace
helm upgrade -i aieg oci://docker.io/envoyproxy/ai-gateway-helm --version "$AIGW_VERSION" -n envoy-ai-gateway-system
kubectl -n envoy-ai-gateway-system wait --for=condition=Available deployment/ai-gateway-controller --timeout=5m

step "3. the fleet: one prefill and one decode CPU engine, the InferencePool and its Endpoint Picker"
kubectl apply -f examples/quickstart-gateway.yaml
kubectl -n "$NAMESPACE" wait --for=condition=Ready "dinf/$FLEET" --timeout="$READY_TIMEOUT" || {
  kubectl -n "$NAMESPACE" get dinf "$FLEET" -o yaml; kubectl -n "$NAMESPACE" get pods -o wide
  kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -20; exit 1; }

step "4. the Gateway and the HTTPRoute to the pool"
kubectl apply -f examples/quickstart-gateway/envoy-gateway.yaml
kubectl -n "$NAMESPACE" wait --for=condition=Programmed "gateway/$GATEWAY" --timeout=5m
kubectl -n "$NAMESPACE" wait --for=condition=InferencePoolAccepted "dinf/$FLEET" --timeout=5m || {
  kubectl -n "$NAMESPACE" get dinf "$FLEET" -o jsonpath='{.status.conditions}'; echo
  kubectl -n "$NAMESPACE" get inferencepool "$FLEET" -o yaml; exit 1; }

step "5. the picker's caller token, on the gateway's side (EnvoyPatchPolicy)"
TOKEN=$(kubectl -n "$NAMESPACE" get secret "$CALLER_SECRET" -o jsonpath='{.data.token}' | base64 -d)
sed "s/EPP_CALLER_TOKEN/$TOKEN/" examples/quickstart-gateway/envoy-patch-policy.yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" get envoypatchpolicy quickstart-gw-epp -o jsonpath='{.status.ancestors[0].conditions}'; echo

step "6. a first answer through the Gateway"
ADDRESS=$(kubectl -n "$NAMESPACE" get gateway "$GATEWAY" -o jsonpath='{.status.addresses[0].value}')
if [ -z "$ADDRESS" ]; then  # no LoadBalancer (kind): the proxy's Service, port-forwarded
  SVC=$(kubectl -n envoy-gateway-system get svc -o jsonpath='{.items[0].metadata.name}' \
    -l "gateway.envoyproxy.io/owning-gateway-namespace=$NAMESPACE,gateway.envoyproxy.io/owning-gateway-name=$GATEWAY")
  kubectl -n envoy-gateway-system port-forward "svc/$SVC" "$LOCAL_PORT:80" >/dev/null &
  PORT_FORWARD=$!
  ADDRESS=127.0.0.1:$LOCAL_PORT
fi
# the policy reaches the proxy asynchronously: retry until the gateway answers (a 5xx until it has the token)
for _ in $(seq 60); do
  curl -sf --max-time 300 "http://$ADDRESS/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"Hi\", \"max_tokens\": 1}" >/dev/null && break
  sleep 5
done
curl -sS --fail-with-body --max-time 300 "http://$ADDRESS/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}"
echo
curl -sS --fail-with-body --max-time 300 "http://$ADDRESS/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Say hello.\"}], \"max_tokens\": 16}"
echo
echo "unserved route: $(curl -s -o /dev/null -w '%{http_code}' "http://$ADDRESS/v1/responses" -d '{}')"
