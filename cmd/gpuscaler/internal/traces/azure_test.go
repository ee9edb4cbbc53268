package traces

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const (
	azureConvFile = "azure-llm-2023-conv.csv"

	// azureHeader and azureRows are the file's own.
	azureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	azureRows   = "2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,396,109\n" +
		"2023-11-16 18:15:51.2224670,879,55\n"
)

func TestReadAzureLLMRealTrace(t *testing.T) {
	data := readTrace(t, azureConvFile)
	reqs, err := ReadAzureLLM(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	checkAzureLLM(t, reqs)
	// wc -l gives 19,366: the header's newline and one per row but the last, which has
	// none. Python's csv module counts 19,366 rows too.
	if got, want := len(reqs), 19_366; got != want {
		t.Errorf("got %d requests, want %d", got, want)
	}
	first := AzureLLMRequest{At: time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC), ContextTokens: 374, GeneratedTokens: 44}
	if reqs[0] != first {
		t.Errorf("got first request %+v, want %+v", reqs[0], first)
	}
	// The README: one hour, about 5 requests/s.
	span := reqs[len(reqs)-1].At.Sub(reqs[0].At)
	if span < 55*time.Minute || span > time.Hour {
		t.Errorf("got requests over %v, want about an hour", span)
	}
	if rate := float64(len(reqs)) / span.Seconds(); rate < 5 || rate > 6 {
		t.Errorf("got %.2f requests/s, want about 5", rate)
	}
}

// checkAzureLLM fails unless reqs keeps every promise ReadAzureLLM makes.
func checkAzureLLM(t *testing.T, reqs []AzureLLMRequest) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("got no requests and no error")
	}
	for i, q := range reqs {
		if i > 0 && q.At.Before(reqs[i-1].At) {
			t.Fatalf("request %d at %v comes after one at %v", i, q.At, reqs[i-1].At)
		}
		if q.At.Location() != time.UTC || q.At.Nanosecond()%100 != 0 {
			t.Errorf("request %d at %v, want UTC in steps of 100 ns", i, q.At)
		}
		if q.ContextTokens < 0 || q.ContextTokens > maxAzureTokens || q.GeneratedTokens < 0 || q.GeneratedTokens > maxAzureTokens {
			t.Errorf("request %d %+v, want 0 to %d tokens", i, q, maxAzureTokens)
		}
	}
}

func TestReadAzureLLMFormats(t *testing.T) {
	in := azureHeader +
		"2023-11-16 18:15:47,1,1\n" +
		"2023-11-16 18:15:46.5,2,2\n" +
		"2023-11-16 18:15:47.0000000,3,3\n" +
		"2023-11-16 18:15:46.0000001,4,4\n"
	reqs, err := ReadAzureLLM(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2023, 11, 16, 18, 15, 46, 0, time.UTC)
	want := []AzureLLMRequest{
		{base.Add(100 * time.Nanosecond), 4, 4},
		{base.Add(500 * time.Millisecond), 2, 2},
		{base.Add(time.Second), 1, 1}, // equal times keep file order
		{base.Add(time.Second), 3, 3},
	}
	for i := range want {
		if i >= len(reqs) || reqs[i] != want[i] {
			t.Fatalf("got %+v, want %+v", reqs, want)
		}
	}
}

func TestReadAzureLLMErrors(t *testing.T) {
	wantReadErrors(t, ReadAzureLLM, badInputs{
		"8 fractional digits": {azureHeader + azureRows + "2023-11-16 18:15:51.39101701,91,16\n",
			[]string{"Azure LLM requests", "line 5", "column TIMESTAMP", `"2023-11-16 18:15:51.39101701"`}},
		"point without digits": {azureHeader + "2023-11-16 18:15:51.,91,16\n",
			[]string{"line 2", "column TIMESTAMP", `"2023-11-16 18:15:51."`}},
		"comma for point": {azureHeader + "\"2023-11-16 18:15:51,3910170\",91,16\n",
			[]string{"line 2", "column TIMESTAMP", `"2023-11-16 18:15:51,3910170"`}},
		"zone": {azureHeader + "2023-11-16 18:15:51.3910170+00:00,91,16\n",
			[]string{"line 2", "column TIMESTAMP", `"2023-11-16 18:15:51.3910170+00:00"`}},
		"no seconds": {azureHeader + "2023-11-16 18:15,91,16\n",
			[]string{"line 2", "column TIMESTAMP", `"2023-11-16 18:15"`}},
		"month 13": {azureHeader + "2023-13-16 18:15:51.3910170,91,16\n",
			[]string{"line 2", "column TIMESTAMP", `"2023-13-16 18:15:51.3910170"`}},
		"no time": {azureHeader + ",91,16\n", []string{"line 2", "column TIMESTAMP", `""`}},
		"negative context": {azureHeader + "2023-11-16 18:15:51.3910170,-91,16\n",
			[]string{"line 2", "column ContextTokens", `"-91"`}},
		"fractional context": {azureHeader + "2023-11-16 18:15:51.3910170,91.5,16\n",
			[]string{"line 2", "column ContextTokens", `"91.5"`}},
		"absurd generated": {azureHeader + "2023-11-16 18:15:51.3910170,91,10000001\n",
			[]string{"line 2", "column GeneratedTokens", `"10000001"`}},
		"no generated": {azureHeader + "2023-11-16 18:15:51.3910170,91,\n",
			[]string{"line 2", "column GeneratedTokens", `""`}},
		"short row": {azureHeader + "2023-11-16 18:15:51.3910170,91\n",
			[]string{"line 2", "column GeneratedTokens", `""`}},
		"header lacks a column": {"TIMESTAMP,ContextTokens\n2023-11-16 18:15:51.3910170,91\n",
			[]string{"Azure LLM requests", "lacks column(s) GeneratedTokens"}},
		"header only": {azureHeader, []string{"Azure LLM requests", errNoRecords.Error()}},
		"empty file":  {"", []string{"Azure LLM requests", "empty file"}},
	})
}

func FuzzAzureLLM(f *testing.F) {
	f.Add(azureHeader + azureRows)
	f.Add(azureHeader + "2023-11-16 18:15:47,1,1\n2023-11-16 18:15:46.5,2,2\n")
	f.Add(azureHeader)
	f.Add(azureHeader + "2023-11-16 18:15:51.39101701,-91,16\n")
	f.Add(azureHeader + "2023-13-16 18:15:51.,91,+16\n")
	f.Add("GeneratedTokens,TIMESTAMP,ContextTokens\n10000000,\"2023-11-16 18:15:51.3\",0\n")
	fuzzRead(f, "Azure LLM requests", ReadAzureLLM, checkAzureLLM)
}
