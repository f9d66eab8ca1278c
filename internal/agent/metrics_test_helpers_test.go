package agent

import (
	dto "github.com/prometheus/client_model/go"
)

func testutilCounter(m *Metrics) float64 {
	var d dto.Metric
	if err := m.StatusWrites.Write(&d); err != nil {
		return -1
	}
	return d.GetCounter().GetValue()
}
