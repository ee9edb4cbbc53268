package gpuscalerv1

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// NodeReportFromJSON parses a NodeReport written as protobuf JSON (field names as in
// events.proto, or their lowerCamelCase JSON names), as operators and scripts write one
// for `gpuscaler publish node`. observed_at is set to now when the report gives none. It
// fails unless the report is valid, so what it returns can be published as it is.
//
// It lives here, beside Validate, rather than in the command: Go's fuzzer scans the
// coverage of every package a test binary links, and the command links them all, which
// made its fuzz target five times slower.
func NodeReportFromJSON(data []byte) (*NodeReport, error) {
	r := new(NodeReport)
	if err := protojson.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("not a NodeReport in protobuf JSON: %w", err)
	}
	if r.ObservedAt == nil {
		r.ObservedAt = timestamppb.Now()
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}
