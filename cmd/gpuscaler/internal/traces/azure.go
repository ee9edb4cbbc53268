package traces

import (
	"cmp"
	"io"
	"slices"
	"time"
)

// AzureLLMRequest is one request of Azure's LLM inference trace
// (AzurePublicDataset data/AzureLLMInferenceTrace_conv.csv or _code.csv). The trace has
// no service times: a replay needs its own model of tokens to seconds.
type AzureLLMRequest struct {
	At              time.Time // arrival (TIMESTAMP), up to 100 ns resolution, UTC (the file gives no zone)
	ContextTokens   int       // prompt tokens, 0 to 10,000,000
	GeneratedTokens int       // output tokens, 0 to 10,000,000
}

// Azure's LLM trace columns, and the most tokens a request is believed to have.
const (
	colAzureAt        = "TIMESTAMP"
	colAzureContext   = "ContextTokens"
	colAzureGenerated = "GeneratedTokens"
	maxAzureTokens    = 10_000_000
)

// ReadAzureLLM reads a whole Azure LLM inference trace and returns its requests sorted
// by arrival (stable: equal times keep their file order). A row with a missing or
// invalid field is an error naming its line, column and value, as is a file with no
// requests.
func ReadAzureLLM(r io.Reader) ([]AzureLLMRequest, error) {
	t, err := newTable(r, "Azure LLM requests", colAzureAt, colAzureContext, colAzureGenerated)
	if err != nil {
		return nil, err
	}
	reqs, err := readRows(t, func(row row) (AzureLLMRequest, bool, error) {
		at, errAt := row.time(colAzureAt, 7)
		ctx, errCtx := row.int(colAzureContext, 0, maxAzureTokens)
		gen, errGen := row.int(colAzureGenerated, 0, maxAzureTokens)
		return AzureLLMRequest{At: at, ContextTokens: int(ctx), GeneratedTokens: int(gen)}, true, cmp.Or(errAt, errCtx, errGen)
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(reqs, func(a, b AzureLLMRequest) int { return a.At.Compare(b.At) })
	return reqs, nil
}
