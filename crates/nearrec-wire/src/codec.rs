//! The protocol's codec: prost's, but a request that does not decode is the caller's mistake,
//! `INVALID_ARGUMENT` (as Armeria and grpc-java's services answer it), not `INTERNAL`, which
//! stays for the node's own faults. An answer that does not decode is still `INTERNAL`: the
//! node's fault, seen by the client.

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with requests that do not decode answered `INVALID_ARGUMENT` (`build.rs`
/// generates the server and client over it).
#[derive(Debug, Clone, Default)]
pub struct NodeCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for NodeCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = NodeDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        NodeDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`], its failures on a request (a message named `…Request`) re-coded.
#[derive(Debug, Clone)]
pub struct NodeDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for NodeDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            let path = std::any::type_name::<U>();
            let name = path.rsplit("::").next().unwrap_or("");
            let package = match path.contains("::inference::") {
                true => "inference",
                false => "nearrec.v1",
            };
            if name.ends_with("Request") {
                Status::invalid_argument(format!(
                    "the request does not decode as {package}.{name}: {}",
                    s.message()
                ))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
