"""antdt.v1.ClusterMonitor on the master: agents and trainers report, anyone reads."""

from __future__ import annotations

import grpc

from antdt_tf.monitor.view import ClusterView
from antdt_tf.rpc import unary_handlers
from antdt_tf.proto import cluster_pb2 as cpb


class ClusterMonitorServicer:
    SERVICE_NAME = "antdt.v1.ClusterMonitor"

    def __init__(self, view: ClusterView):
        self.master_info = cpb.MasterInfo()     # filled in by the master once it serves
        self.view = view

    def ReportAgent(self, req: cpb.AgentReport) -> cpb.ReportAck:
        return cpb.ReportAck(accepted=self.view.report_agent(req))

    def ReportTrainer(self, req: cpb.TrainerReport) -> cpb.ReportAck:
        return cpb.ReportAck(accepted=self.view.report_trainer(req))

    def GetClusterStatus(self, req: cpb.ClusterStatusRequest) -> cpb.ClusterStatus:
        return self.view.status()

    def SetJobCluster(self, req: cpb.JobCluster) -> cpb.JobCluster:
        return self.view.set_job_cluster(req)

    def GetJobCluster(self, req: cpb.GetJobClusterRequest) -> cpb.JobCluster:
        return self.view.job_cluster()

    def GetMasterInfo(self, req: cpb.GetMasterInfoRequest) -> cpb.MasterInfo:
        return self.master_info

    def generic_handler(self) -> grpc.GenericRpcHandler:
        service = cpb.DESCRIPTOR.services_by_name["ClusterMonitor"]
        return grpc.method_handlers_generic_handler(
            self.SERVICE_NAME, unary_handlers(service, self))
