package traces

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

const (
	mooncakeConvFile = "mooncake-conversation.jsonl"

	// mooncakeRows are the file's first three lines; the source's carry hash_ids too.
	mooncakeRows = `{"timestamp": 0, "input_length": 6758, "output_length": 500}
{"timestamp": 0, "input_length": 7322, "output_length": 490}
{"timestamp": 0, "input_length": 7236, "output_length": 794}
`
)

func TestReadMooncakeRealTrace(t *testing.T) {
	reqs, err := ReadMooncake(bytes.NewReader(readTrace(t, mooncakeConvFile)))
	if err != nil {
		t.Fatal(err)
	}
	checkMooncake(t, reqs)
	// The traces' README: 12,031 requests over one hour, 144 to 247 a minute, arrivals
	// in steps of about 3 s.
	if got, want := len(reqs), 12_031; got != want {
		t.Errorf("got %d requests, want %d", got, want)
	}
	if first := (MooncakeRequest{At: 0, InputTokens: 6758, OutputTokens: 500}); reqs[0] != first {
		t.Errorf("got first request %+v, want %+v", reqs[0], first)
	}
	if span := reqs[len(reqs)-1].At; span < 55*time.Minute || span > time.Hour {
		t.Errorf("got requests over %v, want about an hour", span)
	}
	perMinute := map[time.Duration]int{}
	distinct := 0
	for i, r := range reqs {
		perMinute[r.At/time.Minute]++
		if i == 0 || r.At != reqs[i-1].At {
			distinct++
		}
	}
	for m, n := range perMinute {
		if n < 144 || n > 247 {
			t.Errorf("minute %d has %d requests, want 144 to 247", m/time.Minute, n)
		}
	}
	if steps := reqs[len(reqs)-1].At / time.Duration(distinct-1); steps < 2900*time.Millisecond || steps > 3100*time.Millisecond {
		t.Errorf("arrivals come in steps of %v on average, want about 3 s", steps)
	}
}

// checkMooncake fails unless reqs keeps every promise ReadMooncake makes.
func checkMooncake(t *testing.T, reqs []MooncakeRequest) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("got no requests and no error")
	}
	for i, q := range reqs {
		if i > 0 && q.At < reqs[i-1].At {
			t.Fatalf("request %d at %v comes after one at %v", i, q.At, reqs[i-1].At)
		}
		if q.At < 0 || q.At > maxMooncakeMS*time.Millisecond || q.At%time.Millisecond != 0 {
			t.Errorf("request %d at %v, want 0 to a year in whole ms", i, q.At)
		}
		if q.InputTokens < 0 || q.InputTokens > maxAzureTokens || q.OutputTokens < 0 || q.OutputTokens > maxAzureTokens {
			t.Errorf("request %d %+v, want 0 to %d tokens", i, q, maxAzureTokens)
		}
	}
}

func TestReadMooncakeFormats(t *testing.T) {
	in := `{"timestamp": 3000, "input_length": 1, "output_length": 1, "hash_ids": [1, 2, 3]}

  {"output_length": 2, "input_length": 2, "timestamp": 1e3}
{"timestamp": 3000.0, "input_length": 3, "output_length": 3}
{"timestamp": 0, "input_length": 4, "output_length": 4, "extra": {"x": null}}
`
	reqs, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []MooncakeRequest{
		{0, 4, 4},
		{time.Second, 2, 2},
		{3 * time.Second, 1, 1}, // equal times keep file order
		{3 * time.Second, 3, 3},
	}
	if len(reqs) != len(want) {
		t.Fatalf("got %+v, want %+v", reqs, want)
	}
	for i := range want {
		if reqs[i] != want[i] {
			t.Fatalf("got %+v, want %+v", reqs, want)
		}
	}
}

func TestReadMooncakeErrors(t *testing.T) {
	wantReadErrors(t, ReadMooncake, badInputs{
		"not JSON":       {mooncakeRows + "timestamp,input_length\n", []string{"Mooncake requests", "line 4", "invalid character"}},
		"two values":     {`{"timestamp": 0, "input_length": 1, "output_length": 1} {}` + "\n", []string{"line 1", "more than one JSON value"}},
		"no timestamp":   {mooncakeRows + `{"input_length": 1, "output_length": 1}` + "\n", []string{"line 4", "field timestamp missing"}},
		"no output":      {`{"timestamp": 0, "input_length": 1}` + "\n", []string{"line 1", "field output_length missing"}},
		"fraction":       {`{"timestamp": 0.5, "input_length": 1, "output_length": 1}` + "\n", []string{"line 1", `field timestamp "0.5": want a whole number`}},
		"negative input": {`{"timestamp": 0, "input_length": -1, "output_length": 1}` + "\n", []string{"line 1", `field input_length "-1": want 0 to 10000000`}},
		"absurd output":  {`{"timestamp": 0, "input_length": 1, "output_length": 10000001}` + "\n", []string{"line 1", `field output_length "10000001"`}},
		"array":          {"[1, 2, 3]\n", []string{"line 1", "cannot unmarshal array"}},
		"both bad":       {`{"timestamp": -1, "output_length": 1}` + "\n", []string{"line 1", "timestamp", "input_length missing"}},
		"blank only":     {"\n  \n", []string{"Mooncake requests: no requests"}},
		"empty file":     {"", []string{"Mooncake requests: no requests"}},
	})
}

func FuzzMooncake(f *testing.F) {
	f.Add(mooncakeRows)
	f.Add(`{"timestamp": 3000, "input_length": 1, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": 1e3, "input_length": 2, "output_length": 2}`)
	f.Add(`{"timestamp": 0.5, "input_length": -1}`)
	f.Add("")
	f.Add(`{"timestamp": 31536000001, "input_length": 1e400, "output_length": 1}`)
	fuzzRead(f, "Mooncake requests", ReadMooncake, checkMooncake)
}
