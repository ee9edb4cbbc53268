package traces

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	genTD26File     = "gentd26-lora-requests-2024-11-15_27.csv"
	loadLatencyFile = "gentd26-basemodel-load-latency-ms.csv"

	// genTD26Header and the rows below are the file's own.
	genTD26Header = "gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,negative_prompt_length,num_images_per_prompt,num_inference_steps,checkpoint_model_version_id,num_lora\n"
	genTD26Rows   = "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0\n" +
		"2024-11-15 18:16:14,TXT_2_IMG,SUCCEED,43.0,G0001,93.0,,1.0,40.0,M0001,0\n" +
		"2024-11-26 22:50:35,TXT_2_IMG,PENDING,0.0,G0325,,,,,,0\n"
	loadLatencyHeader = "timestamp_anon,value,container_ip\n"
	loadLatencyRows   = "1662859290.0,2639.0,086b31f81b1cf0f15e43fe568e3fb8e4\n" +
		"1662859518.0,39010.0,ff0a53d0bc20c807643d80daf7c71887\n"
)

func TestReadGenTD26RealTrace(t *testing.T) {
	data := readTrace(t, genTD26File)
	reqs, err := ReadGenTD26(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	checkGenTD26(t, reqs)

	// The README's 11,285 requests and 76 checkpoints count every row (wc -l minus the
	// header) and the empty checkpoint of the 7 PENDING rows that name none; those 7 are
	// left out (see ReadGenTD26).
	if rows := bytes.Count(data, []byte("\n")) - 1; rows != 11_285 {
		t.Errorf("got %d rows in the file, want 11,285", rows)
	}
	if got, want := len(reqs), 11_285-7; got != want {
		t.Errorf("got %d requests, want %d", got, want)
	}
	ckpts := make(map[string]bool)
	for _, q := range reqs {
		ckpts[q.Checkpoint] = true
	}
	if got, want := len(ckpts), 76-1; got != want {
		t.Errorf("got %d checkpoints, want %d", got, want)
	}
	first := GenTD26Request{
		At: time.Date(2024, 11, 15, 16, 57, 50, 0, time.UTC), Type: "TXT_2_IMG", Status: "SUCCEED",
		Exec: 32 * time.Second, Group: "G0000", Checkpoint: "M0000",
	}
	if reqs[0] != first {
		t.Errorf("got first request %+v, want %+v", reqs[0], first)
	}
	if got, want := reqs[len(reqs)-1].At, time.Date(2024, 11, 27, 23, 59, 59, 0, time.UTC); !got.Equal(want) {
		t.Errorf("got last request at %v, want %v", got, want)
	}
}

// checkGenTD26 fails unless reqs keeps every promise ReadGenTD26 makes.
func checkGenTD26(t *testing.T, reqs []GenTD26Request) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("got no requests and no error")
	}
	for i, q := range reqs {
		if i > 0 && q.At.Before(reqs[i-1].At) {
			t.Fatalf("request %d at %v comes after one at %v", i, q.At, reqs[i-1].At)
		}
		if q.At.Location() != time.UTC || q.At.Nanosecond() != 0 {
			t.Errorf("request %d at %v, want whole seconds in UTC", i, q.At)
		}
		if q.Exec < 0 || q.Exec > 24*time.Hour {
			t.Errorf("request %d executed %v, want 0 to 24h", i, q.Exec)
		}
		for _, s := range []string{q.Type, q.Status, q.Group, q.Checkpoint} {
			if s == "" || strings.TrimSpace(s) != s {
				t.Errorf("request %d %+v has an empty or untrimmed field %q", i, q, s)
			}
		}
	}
}

func TestReadGenTD26Order(t *testing.T) {
	in := genTD26Header +
		"2024-11-15 10:00:01,TXT_2_IMG,SUCCEED,1,A,,,,,M0,0\n" +
		"2024-11-15 10:00:00,TXT_2_IMG,SUCCEED,1,B,,,,,M0,0\n" +
		"2024-11-15 10:00:01,TXT_2_IMG,SUCCEED,1,C,,,,,M0,0\n" +
		"2024-11-15 10:00:00,TXT_2_IMG,SUCCEED,1.25,D,,,,,M0,0\n"
	reqs, err := ReadGenTD26(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, q := range reqs {
		got += q.Group
	}
	if want := "BDAC"; got != want {
		t.Errorf("got groups in order %s, want %s (by time, ties in file order)", got, want)
	}
	if got, want := reqs[1].Exec, 1250*time.Millisecond; got != want {
		t.Errorf("got exec %v, want %v", got, want)
	}
}

func TestReadGenTD26Pending(t *testing.T) {
	in := genTD26Header +
		"2024-11-26 22:50:35,TXT_2_IMG,PENDING,0.0,G0325,,,,,,0\n" +
		"2024-11-26 22:50:36,TXT_2_IMG,PENDING,0.0,G0325,,,,,M0001,0\n"
	reqs, err := ReadGenTD26(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1 || reqs[0].Checkpoint != "M0001" {
		t.Errorf("got %+v, want only the PENDING request that names its checkpoint", reqs)
	}
}

func TestReadGenTD26Errors(t *testing.T) {
	const good = "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0\n"
	wantReadErrors(t, ReadGenTD26, badInputs{
		"T between date and time": {genTD26Header + good + "2024-11-15T16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"GenTD26 requests", "line 3", "column gmt_create", `"2024-11-15T16:57:50"`}},
		"one-digit hour": {genTD26Header + "2024-11-15 6:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `"2024-11-15 6:57:50"`}},
		"fractional second": {genTD26Header + "2024-11-15 16:57:50.5,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `"2024-11-15 16:57:50.5"`}},
		"zone": {genTD26Header + "2024-11-15 16:57:50Z,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `"2024-11-15 16:57:50Z"`}},
		"February 30": {genTD26Header + "2024-02-30 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `"2024-02-30 16:57:50"`}},
		"hour 24": {genTD26Header + "2024-11-15 24:00:00,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `"2024-11-15 24:00:00"`}},
		"no time": {genTD26Header + ",TXT_2_IMG,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column gmt_create", `""`}},
		"negative exec": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,-1,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column exec_time_seconds", `"-1"`}},
		"NaN exec": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,NaN,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column exec_time_seconds", `"NaN"`}},
		"infinite exec": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,+Inf,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column exec_time_seconds", `"+Inf"`}},
		"exec over a day": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,86401,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column exec_time_seconds", `"86401"`}},
		"no exec": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column exec_time_seconds", `""`}},
		"no type": {genTD26Header + "2024-11-15 16:57:50,,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column predict_type", `""`}},
		"no status": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG, ,32.0,G0000,,,,,M0000,0\n",
			[]string{"line 2", "column predict_status", `""`}},
		"no group": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,,,,,,M0000,0\n",
			[]string{"line 2", "column groupId", `""`}},
		"no checkpoint on a served request": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,,,,,,0\n",
			[]string{"line 2", "column checkpoint_model_version_id", `""`}},
		"no checkpoint on a failed request": {genTD26Header + "2024-11-15 16:57:50,TXT_2_IMG,FAILED,32.0,G0000,,,,,,0\n",
			[]string{"line 2", "column checkpoint_model_version_id", `""`}},
		"bad time on a pending request without checkpoint": {genTD26Header + "2024-11-26 22:50,TXT_2_IMG,PENDING,0.0,G0325,,,,,,0\n",
			[]string{"line 2", "column gmt_create", `"2024-11-26 22:50"`}},
		"short row": {genTD26Header + good + good + "2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000\n",
			[]string{"line 4", "column checkpoint_model_version_id", `""`}},
		"bare quote": {genTD26Header + good + "2024-11-15 16:57:50,TXT\"2,SUCCEED,32.0,G0000,,,,,M0000,0\n",
			[]string{"GenTD26 requests", "line 3", `bare "`}},
		"header lacks a column": {strings.Replace(genTD26Header, "groupId", "group", 1) + good,
			[]string{"GenTD26 requests", "lacks column(s) groupId"}},
		"empty file":  {"", []string{"GenTD26 requests", "empty file"}},
		"header only": {genTD26Header, []string{"GenTD26 requests", errNoRecords.Error()}},
		"only pending requests without checkpoint": {genTD26Header + "2024-11-26 22:50:35,TXT_2_IMG,PENDING,0.0,G0325,,,,,,0\n",
			[]string{"GenTD26 requests", errNoRecords.Error()}},
	})
}

func TestReadGenTD26NoRecords(t *testing.T) {
	_, err := ReadGenTD26(strings.NewReader(genTD26Header))
	if !errors.Is(err, errNoRecords) {
		t.Errorf("got error %v, want %v", err, errNoRecords)
	}
}

func TestReadLoadLatencyRealTrace(t *testing.T) {
	ds, err := ReadLoadLatency(bytes.NewReader(readTrace(t, loadLatencyFile)))
	if err != nil {
		t.Fatal(err)
	}
	// 7,532 lines (wc -l) less the header.
	if got, want := len(ds), 7_531; got != want {
		t.Errorf("got %d latencies, want %d", got, want)
	}
	if got, want := ds[0], 2639*time.Millisecond; got != want {
		t.Errorf("got first latency %v, want %v (file order)", got, want)
	}
	dist, err := NewDurations(ds)
	if err != nil {
		t.Fatal(err)
	}
	// The README rounds: p50 about 22.7 s, p90 42 s, p99 52 s.
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 22700 * time.Millisecond}, {0.9, 42 * time.Second}, {0.99, 52 * time.Second}} {
		if got := dist.Quantile(c.q); got < c.want-300*time.Millisecond || got > c.want+300*time.Millisecond {
			t.Errorf("got p%g %v, want %v ± 0.3s", c.q*100, got, c.want)
		}
	}
}

func TestReadLoadLatencyErrors(t *testing.T) {
	wantReadErrors(t, ReadLoadLatency, badInputs{
		"negative": {loadLatencyHeader + loadLatencyRows + "1662859290.0,-1.0,ab\n",
			[]string{"GenTD26 load latencies", "line 4", "column value", `"-1.0"`}},
		"NaN":          {loadLatencyHeader + "1662859290.0,NaN,ab\n", []string{"line 2", "column value", `"NaN"`}},
		"infinite":     {loadLatencyHeader + "1662859290.0,Inf,ab\n", []string{"line 2", "column value", `"Inf"`}},
		"over an hour": {loadLatencyHeader + "1662859290.0,3600001,ab\n", []string{"line 2", "column value", `"3600001"`}},
		"empty":        {loadLatencyHeader + "1662859290.0,,ab\n", []string{"line 2", "column value", `""`}},
		"short row":    {loadLatencyHeader + "1662859290.0\n", []string{"line 2", "column value", `""`}},
		"not a number": {loadLatencyHeader + "1662859290.0,2.6s,ab\n", []string{"line 2", "column value", `"2.6s"`}},
		"no value column": {"timestamp_anon,latency,container_ip\n" + loadLatencyRows,
			[]string{"GenTD26 load latencies", "lacks column(s) value"}},
		"header only": {loadLatencyHeader, []string{"GenTD26 load latencies", errNoRecords.Error()}},
		"empty file":  {"", []string{"GenTD26 load latencies", "empty file"}},
	})
}

func FuzzGenTD26(f *testing.F) {
	f.Add(genTD26Header + genTD26Rows)
	f.Add(genTD26Header + "2024-11-15 10:00:01,IMG_2_IMG,FAILED,0.5,A,,,,,M0,0\n2024-11-15 10:00:00,INPAINTING,SUCCEED,567.0,B,,,,,M1,0\n")
	f.Add(genTD26Header)
	f.Add(genTD26Header + "2024-11-15T16:57:50,TXT_2_IMG,SUCCEED,-1,G0000,,,,,,0\n")
	f.Add(genTD26Header + "2024-02-30 16:57:50,TXT_2_IMG,SUCCEED,NaN,,,,,,M0000,0\n")
	f.Add("gmt_create,predict_type,predict_status,exec_time_seconds,groupId,checkpoint_model_version_id\n\"2024-11-15 16:57:50\",a,b,1e3,\"g\",\"m\"\"\"\n")
	fuzzRead(f, "GenTD26 requests", ReadGenTD26, checkGenTD26)
}

func FuzzLoadLatency(f *testing.F) {
	f.Add(loadLatencyHeader + loadLatencyRows)
	f.Add(loadLatencyHeader)
	f.Add(loadLatencyHeader + "1662859290.0,-0.0,ab\n1,3600000,c\n")
	f.Add(loadLatencyHeader + "1662859290.0,NaN,ab\n")
	f.Add("value\n0x1p-2\n1e3\n")
	fuzzRead(f, "GenTD26 load latencies", ReadLoadLatency, func(t *testing.T, ds []time.Duration) {
		if len(ds) == 0 {
			t.Fatal("got no latencies and no error")
		}
		for i, d := range ds {
			if d < 0 || d > time.Hour {
				t.Errorf("latency %d is %v, want 0 to 1h", i, d)
			}
		}
	})
}

// BenchmarkReadGenTD26 reads the real trace from memory, and from the file as replay does.
func BenchmarkReadGenTD26(b *testing.B) {
	data := readTrace(b, genTD26File)
	b.Run("memory", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := ReadGenTD26(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("file", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, err := os.Open(filepath.Join(sharedTraces, genTD26File))
			if err != nil {
				b.Fatal(err)
			}
			_, err = ReadGenTD26(f)
			f.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
