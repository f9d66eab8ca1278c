package coordinator

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
)

func TestWindows(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	w := func(start string, d time.Duration, tz string, days ...v1alpha1.Weekday) v1alpha1.MaintenanceWindow {
		return v1alpha1.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: tz, Days: days}
	}
	// 2026-12-01 is a Tuesday.
	for _, tt := range []struct {
		name    string
		ws      []v1alpha1.MaintenanceWindow
		now     string
		open    bool
		next    string
		wantErr bool
	}{
		{name: "no window: always open", now: "2026-12-01T12:00:00Z", open: true},
		{name: "inside a daily window", ws: []v1alpha1.MaintenanceWindow{w("02:00", 4*time.Hour, "")}, now: "2026-12-01T03:00:00Z", open: true},
		{name: "at its start", ws: []v1alpha1.MaintenanceWindow{w("02:00", 4*time.Hour, "")}, now: "2026-12-01T02:00:00Z", open: true},
		{name: "at its end it is closed", ws: []v1alpha1.MaintenanceWindow{w("02:00", 4*time.Hour, "")}, now: "2026-12-01T06:00:00Z", next: "2026-12-02T02:00:00Z"},
		{name: "across midnight", ws: []v1alpha1.MaintenanceWindow{w("22:00", 4*time.Hour, "")}, now: "2026-12-02T01:00:00Z", open: true},
		{name: "only on Saturdays", ws: []v1alpha1.MaintenanceWindow{w("02:00", time.Hour, "", "Saturday")}, now: "2026-12-01T02:30:00Z", next: "2026-12-05T02:00:00Z"},
		{name: "in another time zone", ws: []v1alpha1.MaintenanceWindow{w("02:00", time.Hour, "Europe/Berlin")}, now: "2026-12-01T01:30:00Z", open: true},
		{name: "the earliest of two", ws: []v1alpha1.MaintenanceWindow{w("20:00", time.Hour, ""), w("14:00", time.Hour, "")}, now: "2026-12-01T12:00:00Z", next: "2026-12-01T14:00:00Z"},
		{name: "a week-long window opened days ago", ws: []v1alpha1.MaintenanceWindow{w("00:00", 168*time.Hour, "", "Sunday")}, now: "2026-12-04T12:00:00Z", open: true},
		{name: "an unknown time zone", ws: []v1alpha1.MaintenanceWindow{w("02:00", time.Hour, "Mars/Olympus")}, now: "2026-12-01T12:00:00Z", wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			open, next, err := Windows(tt.ws, at(tt.now))
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v", err)
			}
			if tt.wantErr {
				return
			}
			want := time.Time{}
			if tt.next != "" {
				want = at(tt.next)
			}
			if open != tt.open || !next.Equal(want) {
				t.Errorf("open %v next %s; want open %v next %s", open, next, tt.open, want)
			}
		})
	}
}
