// Package keda checks gpuscaler against KEDA's own client code: the external and
// external-push scalers of github.com/kedacore/keda/v2/pkg/scalers drive a running
// gpuscaler scaler binary over real gRPC, fed by the real collector and publish commands
// through the scaler's embedded NATS server. Everything is in the tests; see README.md.
package keda
