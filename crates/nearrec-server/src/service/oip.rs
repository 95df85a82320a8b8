//! The Open Inference Protocol (`inference.GRPCInferenceService`, KServe's V2 and Triton's gRPC
//! protocol), served on the node's port beside `nearrec.v1.Node`: each call through its verb's
//! row as the native calls are ([`NodeService::around`]: the same ACL, deadlines, admission,
//! limits, metrics and logs). Each store is two models — `STORE`, its kept model (its pooled
//! lookups when it keeps none), and `STORE.pooled`, its pooled lookups — whose tensors are
//! `nearrec_wire::oip`'s.

use std::sync::atomic::Ordering;

use nearrec::Error;
use nearrec_wire::inference as pb;
use nearrec_wire::oip::{self, Inputs, Signature};
use nearrec_wire::verbs::Verbed;
use pb::grpc_inference_service_server::GrpcInferenceService;
use tonic::{Request, Response};

use super::seen::{Seen, Summary};
use super::{Answer, Checked, NodeService, bad, holding};
use crate::node::Shared;

impl NodeService {
    /// A call about the node (no store): its caller authenticated and given its place, the call
    /// observed.
    async fn about_node<M, T>(&self, request: Request<M>, answer: fn(&Shared) -> T) -> Answer<T>
    where
        M: Verbed + Summary + prost::Message,
        T: prost::Message,
    {
        let verb = request.get_ref().verb();
        let seen = Seen::of(&request);
        let answered = async {
            let _caller = self.caller(&request, verb.rpc)?;
            Ok(Response::new(answer(&self.0)))
        };
        self.observed(verb, &seen, |r: &T| r.encoded_len(), answered)
            .await
    }

    async fn call_model_ready(
        &self,
        _call: Checked<'_>,
        req: pb::ModelReadyRequest,
    ) -> Answer<pb::ModelReadyResponse> {
        oip::check_version(&req.name, &req.version).map_err(bad)?;
        let ready = self.0.ready.load(Ordering::Acquire);
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn call_model_metadata(
        &self,
        call: Checked<'_>,
        req: pb::ModelMetadataRequest,
    ) -> Answer<pb::ModelMetadataResponse> {
        oip::check_version(&req.name, &req.version).map_err(bad)?;
        let (store, pooled) = (call.store.clone(), oip::store_of(&req.name).1);
        let (signature, held) = self
            .work(&call, move || Signature::of(&*store, pooled))
            .await?;
        Ok(holding(signature.metadata(&req.name), held))
    }

    /// The kept model run on the request's tensors, or (`STORE.pooled`, or a store that keeps
    /// no model) its lookups pooled, in the request's order.
    async fn call_model_infer(
        &self,
        call: Checked<'_>,
        req: pb::ModelInferRequest,
    ) -> Answer<pb::ModelInferResponse> {
        oip::check_version(&req.model_name, &req.model_version).map_err(bad)?;
        let pooled = oip::store_of(&req.model_name).1;
        if pooled {
            oip::check_outputs(&req, oip::POOLED).map_err(bad)?;
        }
        let inputs = Inputs::of(&req).map_err(bad)?;
        let store = call.store.clone();
        let ((output, batch, width, values, stages), held) = self
            .work(&call, move || {
                if !pooled {
                    let model = store.able(store.inference(), "infer")?;
                    match model.infer(&inputs.dense, &inputs.lookups()) {
                        Ok(out) => {
                            let (b, w, stages) = (out.batch, out.width, out.times.stages);
                            return Ok((oip::PREDICTIONS, b, w, out.outputs, stages));
                        }
                        Err(Error::NoModel { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                if !inputs.dense.is_empty() {
                    return Err(Error::InvalidRequest {
                        table: Some(oip::DENSE.to_owned()),
                        position: None,
                        reason: "is no input of a store's pooled lookups".into(),
                    });
                }
                let (out, read) = store.lookup(&inputs.lookups())?;
                Ok((oip::POOLED, out.batch, out.width(), out.values, read.stages))
            })
            .await?;
        self.0.metrics.stages(call.verb.rpc, &stages);
        // a store's own model answers `predictions`, or `pooled` when it keeps none
        oip::check_outputs(&req, output).map_err(bad)?;
        Ok(holding(
            oip::answer(&req, output, batch, width, values),
            held,
        ))
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for NodeService {
    async fn server_live(
        &self,
        request: Request<pb::ServerLiveRequest>,
    ) -> Answer<pb::ServerLiveResponse> {
        self.about_node(request, |_| pb::ServerLiveResponse { live: true })
            .await
    }

    async fn server_ready(
        &self,
        request: Request<pb::ServerReadyRequest>,
    ) -> Answer<pb::ServerReadyResponse> {
        self.about_node(request, |node| pb::ServerReadyResponse {
            ready: node.ready.load(Ordering::Acquire),
        })
        .await
    }

    async fn server_metadata(
        &self,
        request: Request<pb::ServerMetadataRequest>,
    ) -> Answer<pb::ServerMetadataResponse> {
        self.about_node(request, |_| pb::ServerMetadataResponse {
            name: "nearrec".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            extensions: Vec::new(),
        })
        .await
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Answer<pb::ModelReadyResponse> {
        self.around(request, Self::call_model_ready).await
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Answer<pb::ModelMetadataResponse> {
        self.around(request, Self::call_model_metadata).await
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Answer<pb::ModelInferResponse> {
        self.around(request, Self::call_model_infer).await
    }
}
