#!/usr/bin/env bash
# docs/quickstart.md as one script: images, the operator, a CPU fleet of a small public model, a first answer,
# then cleanup. Needs kubectl and helm pointed at a cluster (any: kind, k3d, minikube, a cloud one), and docker
# when BUILD_IMAGES=1. Run from anywhere; tests/k8s/test_quickstart_k8s.py runs it.
#
#   REGISTRY=registry.example.com/me BUILD_IMAGES=1 docs/quickstart.sh
#
# REGISTRY      where the images are (or go, with BUILD_IMAGES=1); the cluster must be able to pull from it
# BUILD_IMAGES  1: `make images push-images` first (docker; takes a while: the runtime images hold vLLM)
# HF_TOKEN      set: also the token Secret a gated model would name (this model needs none)
# LOCAL_PORT    the port-forward's local port (default 8000)
# READY_TIMEOUT how long to wait for the fleet (default 30m: the engines download the model, ~1 GB)
# KEEP          1: leave everything in place (skip the cleanup)
set -euo pipefail

REGISTRY=${REGISTRY:?set REGISTRY to where the images are (e.g. registry.example.com/me)}
BUILD_IMAGES=${BUILD_IMAGES:-0}
LOCAL_PORT=${LOCAL_PORT:-8000}
READY_TIMEOUT=${READY_TIMEOUT:-30m}
KEEP=${KEEP:-0}
NAMESPACE=pdfleet-demo                     # examples/quickstart-cpu.yaml's metadata.namespace
FLEET=quickstart                           # its metadata.name
MODEL=Qwen/Qwen2.5-0.5B-Instruct           # its spec.model.name: the name requests use
ROUTER_SERVICE=$FLEET-router               # the router's Service (spec.router.port 8000)
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

cleanup() {
  [ -n "${PORT_FORWARD:-}" ] && kill "$PORT_FORWARD" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then return; fi
  step "cleanup"
  kubectl delete -f examples/quickstart-cpu.yaml --ignore-not-found --wait=true --timeout=5m || true
  kubectl delete namespace "$NAMESPACE" --ignore-not-found --wait=true --timeout=5m || true
  helm uninstall pdfleet -n pdfleet-system --wait || true
  kubectl delete namespace pdfleet-system --ignore-not-found --wait=true --timeout=5m || true
  # Helm never deletes a chart's CRDs; removing them would delete every fleet in the cluster, so we leave them:
  #   kubectl delete -f crds/
}
trap cleanup EXIT

if [ "$BUILD_IMAGES" = 1 ]; then
  step "1. images: build and push operator, runtime and runtime-cpu to $REGISTRY"
  make images push-images REGISTRY="$REGISTRY"
fi

step "2. the operator, with Helm, into pdfleet-system (the chart's CRDs come with it)"
helm upgrade --install pdfleet charts/pdfleet -n pdfleet-system --create-namespace \
  --set image.repository="$REGISTRY/pdfleet-operator" \
  --set runtimeImage.repository="$REGISTRY/pdfleet-runtime-cpu" \
  --wait --timeout 5m

step "3. a namespace for the fleet"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
if [ -n "${HF_TOKEN:-}" ]; then
  # what a gated model's spec.model.source.hf.tokenSecretRef {name: hf-token, key: token} would name
  kubectl -n "$NAMESPACE" create secret generic hf-token --from-literal=token="$HF_TOKEN" \
    --dry-run=client -o yaml | kubectl apply -f -
fi

step "4. the fleet: one prefill and one decode CPU engine, and the router"
kubectl apply -f examples/quickstart-cpu.yaml
kubectl -n "$NAMESPACE" wait --for=condition=Ready "dinf/$FLEET" --timeout="$READY_TIMEOUT" || {
  kubectl -n "$NAMESPACE" get dinf "$FLEET" -o yaml; kubectl -n "$NAMESPACE" get pods -o wide
  kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -20; exit 1; }
kubectl -n "$NAMESPACE" get dinf "$FLEET" -o wide

step "5. a first answer, through the router"
kubectl -n "$NAMESPACE" port-forward "svc/$ROUTER_SERVICE" "$LOCAL_PORT:8000" >/dev/null &
PORT_FORWARD=$!
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$LOCAL_PORT/health" >/dev/null && break; sleep 1; done
curl -sS --fail-with-body --max-time 300 "http://127.0.0.1:$LOCAL_PORT/v1/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\": \"$MODEL\", \"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}"
echo
