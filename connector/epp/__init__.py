"""The gateway's Endpoint Picker (GAIE's Endpoint Picker Protocol over Envoy ext_proc): P/D behind a
cluster's Gateway with no pdfleet router in the data path. See docs/gateway.md."""
