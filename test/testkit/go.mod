module github.com/gpuscaler/gpuscaler/test/testkit

// The helpers every gpuscaler test suite shares: the main module's tests and the test
// modules (test/e2e, test/keda, test/manifests). The standard library only, so requiring
// it lifts no dependency anywhere.
go 1.26.0
